// Prefill order: which lanes' prefill chunks run between two steps of the decoding lanes
// (--lane-batching, Scheduler::StepTogether), and whether a job waits, before its restore, for
// another lane to compute a prefix they share.
//
// Rule: the lane with the fewest rows left to prefill goes first, counted in steps of
// kRowsStep (jobs within a step of each other keep the order they were admitted in); a lane that
// has been passed over `overdue` chunks in a row goes before the others (the first admitted of
// those). Fewest rows left: a hit's suffix or a short prompt does not wait for a long prefill,
// not even for a cold prompt of one chunk (a 15-row suffix and a 510-row prompt are both one
// chunk of 512), and of a burst of cold prompts the first admitted gets its first token first
// instead of all of them last, as they would taking turns. In steps, not single rows: jobs of
// about the same size keep the order they came in, so clients that come back apart stay apart.
// Passed over: a long prompt is not starved by a stream of short ones. With a TTFT target
// (skippy-server --ttft-slo-ms), the lanes that can no longer meet it go after those that still
// can (each group in the order above, overdue lanes first whatever they are): a prompt that is
// late anyway does not make another one late too, which is what goodput counts.
//
// Between two decode steps the chunks run in that order up to a budget of rows (the
// --prefill-chunk size): at least one chunk, then the next ones while they fit (PrefillTurn), so
// the short suffixes of several hits go in one turn, and one long chunk takes a turn alone; the
// decoding lanes wait for at most about one chunk's worth of prefill between two of their tokens,
// as in chunked-prefill schedulers (Sarathi-Serve's token budget). The order is asked again
// after every chunk, so a job that arrived during the turn's chunks takes its place among them
// while the budget lasts. A lane runs one chunk a turn, unless its whole prefill fit in what was
// left of the budget when its first chunk ran: then its next chunks follow in the same turn, so a
// prompt cut short at its records (an exact-boundary family's hit: the branch point, then the
// tail) is not held back a decode step per cut, while a long prefill planned in short chunks does
// not take the rest of the budget from a hit that arrives meanwhile.
//
// Shared prefill: jobs that arrive together with a prefix in common (one system prompt, one
// document, the same prompt retried) all miss, since nothing is recorded until a lane has computed
// the prefix, and each would prefill it again. A job about to begin waits instead for a lane that
// is computing that prefix, and restores it once that lane's first token is out (its prompt-end
// record, or the exact-boundary records along its prompt; an exact repeat gets the decoded result).
// Rule: the job waits for a prefill in flight, in its namespace, whose records will serve at least
// `min_shared` tokens of the job's prompt beyond what the job could restore now (the gain), and
// has no more tokens left to prefill than the job would prefill without it plus the gain. That
// bound is where waiting lowers the sum of the two jobs' times to first token, whether the lanes
// take turns (the job's prefill would be slowed by as many of the other's tokens) or the other
// would go first anyway (fewest chunks left), and total prefill work drops by the gain either way.
// A prefill in flight never waits, so the waits cannot form a cycle, and each ends when that
// lane's first token is out (or its job ends).
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace skippy::server {

struct PrefillCandidate {
  size_t rows_left = 0;     // prompt rows still to prefill (at least 1)
  uint64_t admitted = 0;    // admission order: lower came first
  size_t passed_over = 0;   // chunks given to other lanes since this lane's last one
  size_t next_rows = 0;     // rows of its next chunk (PrefillTurn's budget)
  // Its time-to-first-token target (--ttft-slo-ms) cannot be met any more, even if the rest of its
  // prefill ran now.
  bool late = false;
};

// Rows left are compared in steps of this many (see the rule above).
inline constexpr size_t kRowsStep = 64;

// The index in `candidates` of the lane whose chunk runs next; nullopt when there is none.
std::optional<size_t> NextPrefill(std::span<const PrefillCandidate> candidates, size_t overdue);

// One turn's prefill chunks (the rule above). Use: build the candidates of the lanes that are
// Open, ask Next, run that chunk and tell Ran; again until Next says nullopt.
class PrefillTurn {
 public:
  PrefillTurn(size_t lanes, size_t budget_rows);

  // Whether `lane` may still run a chunk in this turn.
  bool Open(size_t lane) const { return state_[lane] != kClosed; }

  // The index in `candidates` (chunks of open lanes) of the chunk to run next: NextPrefill's
  // pick, always when it is the turn's first chunk, else when the turn's rows stay within the
  // budget with it. nullopt ends the turn, even if a later lane's chunk would fit.
  std::optional<size_t> Next(std::span<const PrefillCandidate> candidates, size_t overdue) const;

  // `lane` ran its chunk `c` (as its candidate was when Next picked it).
  void Ran(size_t lane, const PrefillCandidate& c);

 private:
  enum State : char { kNotRun, kFinishing, kClosed };
  size_t budget_rows_;
  size_t rows_run_ = 0;
  std::vector<State> state_;
};

// Chunks together (skippy-server --chunks-together on): the chunks of a turn, in the order Next
// gives them, share one graph (Engine::DecodeStepWithChunks) while that lowers the sum of the waits
// it moves. A graph of n rows takes about t(n) = max(graph_ms, n * row_ms): below some rows it is
// the pass over the weights (graph_ms), above them compute (on bench Llama Q4_K_M on two cores, two
// 8-row chunks took 13.8 ms in one graph and 19.0 in two, two of 16 rows 26.7 and 27.8;
// docs/evidence/chunks-together/). A chunk of `rows` that joins a group of `group_rows` makes each
// of the group's chunks that end their prompt (`group_first_tokens`: their first tokens come when
// the whole graph is done) wait t(group_rows + rows) - t(group_rows) more, and saves
// t(group_rows) + t(rows) - t(group_rows + rows) to itself and to each of `waiting` other lanes
// that wait for the turn to go on (decoding lanes, other prefills). It joins when what it saves,
// so weighted, is larger; always when no chunk of the group ends its prompt (nobody's first token
// waits for it); with a cost unknown (0, before the first prefill), only then. So short suffixes
// join, where a graph is mostly weight reads, and long chunks do not join a suffix. The caller
// keeps the group within a ubatch and in the turn's order.
struct ChunkGroupCosts {
  double graph_ms = 0;  // a graph's pass over the weights
  double row_ms = 0;    // a prefill row's compute
};
bool JoinsChunkGroup(size_t group_first_tokens, size_t group_rows, size_t rows, size_t waiting,
                     const ChunkGroupCosts& costs);

// A job whose prefill is under way: begun (restored), its first token not out yet.
struct InFlightPrefill {
  std::span<const int32_t> prompt;
  std::string_view tenant_namespace;
  size_t restored = 0;  // prompt tokens its restore gave it
  size_t pos = 0;       // prompt tokens in its lane now
};

struct SharedPrefill {
  size_t index = 0;   // in in_flight
  size_t shared = 0;   // prompt tokens the two have in common
  size_t restore = 0;  // of those, what the job will restore once that prefill's first token is out
};

// How much of the `shared` tokens the job could restore from in_flight[index]'s records: `now`,
// and `later`, once that prefill's first token is out (see LaneCache::RecordsWithin).
struct SharedRestore {
  size_t now = 0;
  size_t later = 0;
};
using SharedRestoreFn = std::function<SharedRestore(size_t index, size_t shared)>;

// The prefill that a job with `prompt` in `tenant_namespace` waits for (the rule above; the one
// whose records will serve the most of its prompt), or nullopt: the job begins now. What the job
// restores now is at least what the prefill in flight restored itself (of the shared tokens);
// without `restorable`, all the shared tokens are taken to be recorded.
std::optional<SharedPrefill> SharedPrefillToWaitFor(std::span<const int32_t> prompt, std::string_view tenant_namespace,
                                                    std::span<const InFlightPrefill> in_flight, size_t min_shared,
                                                    const SharedRestoreFn& restorable = {});

}  // namespace skippy::server
