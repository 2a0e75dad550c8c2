set terminal pngcairo size 1100,500 font 'sans,10'
set output '/tmp/fb-f16-rounds/speedup-by-use-case.png'
set title 'Median speedup across families, by use case'
set datafile missing '?'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set ylabel 'speedup (x, log scale)'
set grid ytics
set xtics rotate by -30 left
unset key
set logscale y
set yrange [0.1:*]
set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#aa0000'
plot '/tmp/fb-f16-rounds/speedup-by-use-case.dat' using 2:xtic(1) title columnheader
