set terminal pngcairo size 1100,500 font 'sans,10'
set output '/tmp/sc-ref16/ttft-falcon-h1.png'
set title 'falcon-h1: TTFT p50 by workload (ms, lower is better)'
set datafile missing '?'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set ylabel 'TTFT p50 ms'
set grid ytics
set xtics rotate by -30 left
set key outside right top
set yrange [0:*]
plot '/tmp/sc-ref16/ttft-falcon-h1.dat' using 2:xtic(1) title columnheader, '/tmp/sc-ref16/ttft-falcon-h1.dat' using 3 title columnheader, '/tmp/sc-ref16/ttft-falcon-h1.dat' using 4 title columnheader
