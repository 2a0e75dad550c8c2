// The byte layout of a sequence-state export (llama_state_seq_get_data) of the pinned llama.cpp,
// for attention KV caches only, and the one rewrite Skippy needs of it.
//
// Why: a sliding-window cache exports only the cells of the window (the older cells of the
// sequence are masked and skipped), and an import puts the cells it reads into the first free cells
// of the lane's stream. A recompute leaves the window where it was computed, at cell indices
// [first, n), behind the masked cells. Flash attention's tiled path groups cells into tiles by
// absolute index and the KV view length follows the highest used cell, so an import at [0, window)
// computes the next tokens in a different order and differs in the last bits. PadToPositionZero
// gives every KV block of the export leading cells for the positions [0, first) it skipped, with
// zero K/V: after the import the window sits at [first, n) behind cells that the SWA mask hides,
// as in the recompute (a masked cell contributes exactly nothing, whatever its data).
//
// Layout (llama_context::state_seq_get_data, llama_kv_cache::state_write):
//   u32 magic, i32 seq_id, then one block per KV cache (an iSWA memory writes the full-attention
//   cache, then the SWA cache): u32 n_stream, and per stream u32 cell_count and, when non-zero,
//   cell_count cells {i32 pos, u32 n_seq_id (= 1), [12-byte cell ext], i32 seq_id}, then
//   u32 v_trans, u32 n_layer, per layer {i32 k_type, u64 k_row_bytes, rows}, and per layer
//   {i32 v_type, u64 v_row_bytes, rows} or, transposed, {i32 v_type, u32 v_el_bytes, u32 n_embd_v,
//   n_embd_v runs of cell_count elements}.
// The parser checks every count against the bytes and fails rather than guess: a layout it does
// not recognise (recurrent state, a cache without V for some layer, a llama.cpp update) is
// FailedPrecondition, and the caller must then not serve such an export past the window.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "skippy/common/status.h"

namespace skippy::runtime {

struct KvBlockShape {
  int32_t first_pos = 0;      // lowest position of the block's cells
  uint32_t cell_count = 0;    // cells with data (positions first_pos .. first_pos + cell_count - 1)
  uint32_t ext_bytes = 0;     // bytes of cell ext per cell (0, or 12 with M-RoPE / n-gram token ids)
};

// The KV blocks of a sequence-state export, in order. FailedPrecondition if the bytes do not parse
// exactly (see above) or a block's positions are not consecutive.
StatusOr<std::vector<KvBlockShape>> ParseKvSequenceState(std::span<const uint8_t> bytes);

// Returns `bytes` with each KV block that starts past position 0 extended down to position 0 by
// zero-data cells. `tokens` are the sequence's tokens from position 0 (at least as many as the
// longest padding, which bounds the output): a cell ext carries the token id, which an export with
// cell ext needs for the added cells too. The bytes are parsed whole before anything is written.
// Errors as ParseKvSequenceState, and InvalidArgument if `tokens` is too short.
StatusOr<std::vector<uint8_t>> PadToPositionZero(std::span<const uint8_t> bytes, std::span<const int32_t> tokens);

// A hybrid model's full sequence export is the header (u32 magic, i32 seq_id), the attention KV
// block, then the recurrent state block; an export with LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY is the
// header and the recurrent block alone. HybridRecurrentOffset returns where the recurrent block of a
// full export starts, RecurrentPartOfHybridState the partial export cut out of it (header + bytes
// from there), for a restore onto a lane that already holds the attention KV
// (Engine::RestoreRecurrentOnto). Errors as ParseKvSequenceState for the KV block;
// FailedPrecondition if nothing follows it.
inline constexpr size_t kStateHeaderBytes = sizeof(uint32_t) + sizeof(int32_t);
StatusOr<size_t> HybridRecurrentOffset(std::span<const uint8_t> bytes);
StatusOr<std::vector<uint8_t>> RecurrentPartOfHybridState(std::span<const uint8_t> bytes);

// The full export a hybrid sequence would have given at n_tokens, built after the fact: the
// attention KV block of `later` (a full export of the same sequence, taken when it held more
// tokens) cut to its first n_tokens cells, then `recurrent_part` (a PARTIAL_ONLY export taken at
// n_tokens). Attention KV of a position never changes once computed, so the lane need not stop to
// copy it at every record boundary: only the recurrent state, which later tokens overwrite, is
// copied there. Byte-identical to the export at n_tokens when the cells hold positions 0.. in
// order (checked: FailedPrecondition otherwise); errors as ParseKvSequenceState for bytes it does
// not know, InvalidArgument for a part of another sequence.
StatusOr<std::vector<uint8_t>> HybridStateAt(std::span<const uint8_t> later, size_t n_tokens,
                                             std::span<const uint8_t> recurrent_part);

}  // namespace skippy::runtime
