// RadixIndex implementation notes.
//
// Tree shape. Each scope owns two trees with the same node type: `live` (findable entries) and
// `ghosts` (removed entries remembered for miss reasons). A node's `edge` is the run of tokens from
// its parent; `depth` is the prefix length at the end of the edge. Children are keyed by the first
// token of their edge in an ordered btree, so "the lexicographically first entry below a node" is a
// greedy walk. Invariants (CheckInvariants): every non-root node either holds an entry or has at
// least two children (a node with no entry and one child is merged into the child; a node with no
// entry and no child is deleted), and `rk_in_subtree` counts the entries that serve shorter prefixes
// (kResidentKv, not exact_only) at or below the node.
//
// Lookup. Walk the request tokens down the tree. When the walk enters a child whose subtree holds a
// kResidentKv entry after matching k tokens of its edge, every such entry shares at least
// `depth_before + k` tokens with the request, so that length is servable by attention KV; because
// subtree counts only shrink going down, the deepest such point is the best resident answer. Exact
// kinds are only candidates at nodes whose whole edge matched. The cost is one btree probe per
// branching node plus one token comparison per request token: O(prompt) regardless of the number of
// stored entries.
//
// Lifetime. Entries live in `entries_` by id. Erase detaches an entry from its node and prunes the
// node; if the entry is still pinned it stays in `entries_` as a zombie (node == nullptr) and is
// reported freed by the last Unpin. Evictable (unpinned, live) entries sit in an ordered set keyed
// by (priority, last_use, id); pin/unpin/touch move them in and out.
#include "skippy/cache/radix_index.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <set>
#include <tuple>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"

namespace skippy::cache {

struct ScopeTrees;

namespace {

size_t CommonPrefix(const Token* a, const Token* b, size_t n) {
  size_t i = 0;
  constexpr size_t kChunk = 32;
  while (i + kChunk <= n && std::memcmp(a + i, b + i, kChunk * sizeof(Token)) == 0) i += kChunk;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

struct Node;

struct Entry {
  EntryInfo info;
  ScopeTrees* scope = nullptr;
  Node* node = nullptr;  // nullptr once erased (zombie) -- or for ghosts once dropped
  uint32_t refs = 0;
  uint64_t last_use = 0;
};

struct Node {
  std::vector<Token> edge;
  Node* parent = nullptr;
  size_t depth = 0;
  absl::btree_map<Token, std::unique_ptr<Node>> children;
  std::array<Entry*, kPayloadKindCount> entries{};
  uint32_t rk_in_subtree = 0;

  bool HasEntries() const {
    for (Entry* e : entries) {
      if (e) return true;
    }
    return false;
  }
};

// A tree of entries. Owns nodes, not entries.
class Tree {
 public:
  Tree() : root_(std::make_unique<Node>()) {}

  size_t nodes() const { return nodes_; }
  size_t edge_tokens() const { return edge_tokens_; }
  bool empty() const { return root_->children.empty(); }
  const Node* root() const { return root_.get(); }

  // The node at exactly `tokens`, created (splitting edges) if absent.
  Node* FindOrCreate(std::span<const Token> tokens) {
    Node* n = root_.get();
    size_t pos = 0;
    while (pos < tokens.size()) {
      auto it = n->children.find(tokens[pos]);
      if (it == n->children.end()) {
        auto leaf = std::make_unique<Node>();
        leaf->edge.assign(tokens.begin() + pos, tokens.end());
        leaf->parent = n;
        leaf->depth = tokens.size();
        Node* raw = leaf.get();
        n->children.emplace(tokens[pos], std::move(leaf));
        ++nodes_;
        edge_tokens_ += raw->edge.size();
        return raw;
      }
      Node* c = it->second.get();
      size_t rest = tokens.size() - pos;
      size_t k = CommonPrefix(c->edge.data(), tokens.data() + pos, std::min(rest, c->edge.size()));
      if (k == c->edge.size()) {
        n = c;
        pos += k;
        continue;
      }
      // Split c after k tokens: n -> mid -> c.
      auto mid = std::make_unique<Node>();
      mid->edge.assign(c->edge.begin(), c->edge.begin() + k);
      mid->parent = n;
      mid->depth = pos + k;
      mid->rk_in_subtree = c->rk_in_subtree;
      std::unique_ptr<Node> cown = std::move(it->second);
      cown->edge.erase(cown->edge.begin(), cown->edge.begin() + k);
      cown->parent = mid.get();
      Token ckey = cown->edge[0];
      mid->children.emplace(ckey, std::move(cown));
      Node* mraw = mid.get();
      it->second = std::move(mid);
      ++nodes_;
      n = mraw;
      pos += k;
    }
    return n;
  }

  // The node at exactly `tokens`, or nullptr.
  const Node* FindExact(std::span<const Token> tokens) const {
    const Node* n = root_.get();
    size_t pos = 0;
    while (pos < tokens.size()) {
      auto it = n->children.find(tokens[pos]);
      if (it == n->children.end()) return nullptr;
      const Node* c = it->second.get();
      if (tokens.size() - pos < c->edge.size()) return nullptr;
      if (CommonPrefix(c->edge.data(), tokens.data() + pos, c->edge.size()) != c->edge.size()) {
        return nullptr;
      }
      pos += c->edge.size();
      n = c;
    }
    return n;
  }

  static void AddRk(Node* n, int delta) {
    for (; n != nullptr; n = n->parent) n->rk_in_subtree += delta;
  }

  // Attaches `e` at node `n` (slot must be empty).
  static void Attach(Node* n, Entry* e) {
    n->entries[static_cast<int>(e->info.desc.kind)] = e;
    e->node = n;
    if (ServesShorterPrefixes(e->info.desc)) AddRk(n, +1);
  }

  // Detaches `e` from its node and prunes/merges nodes.
  void Detach(Entry* e) {
    Node* n = e->node;
    n->entries[static_cast<int>(e->info.desc.kind)] = nullptr;
    if (ServesShorterPrefixes(e->info.desc)) AddRk(n, -1);
    e->node = nullptr;
    Prune(n);
  }

  // Best serving entry for `tokens` (see the header for the rule). Returns entry + usable length.
  // path (optional): how many request tokens the walk matched along the tree's edges.
  std::pair<Entry*, size_t> Best(std::span<const Token> tokens, size_t* path = nullptr) const {
    const Node* n = root_.get();
    size_t pos = 0;
    size_t best_rk = 0;
    const Node* rk_from = nullptr;
    size_t best_exact = 0;
    const Node* exact_at = nullptr;
    while (true) {
      if (pos > 0 && n->HasEntries()) {
        best_exact = pos;
        exact_at = n;
      }
      if (pos == tokens.size()) break;
      auto it = n->children.find(tokens[pos]);
      if (it == n->children.end()) break;
      const Node* c = it->second.get();
      size_t rest = tokens.size() - pos;
      size_t k = CommonPrefix(c->edge.data(), tokens.data() + pos, std::min(rest, c->edge.size()));
      if (c->rk_in_subtree > 0) {
        best_rk = pos + k;
        rk_from = c;
      }
      if (k < c->edge.size()) {
        pos += k;
        break;
      }
      pos += k;
      n = c;
    }
    if (path) *path = pos;
    if (best_exact == 0 && best_rk == 0) return {nullptr, 0};
    if (best_exact >= best_rk) {
      for (Entry* e : exact_at->entries) {
        if (e) return {e, best_exact};
      }
    }
    // Lexicographically first resident entry at or below rk_from.
    const Node* d = rk_from;
    while (true) {
      Entry* e = d->entries[static_cast<int>(PayloadKind::kResidentKv)];
      if (e && ServesShorterPrefixes(e->info.desc)) return {e, best_rk};
      const Node* next = nullptr;
      for (const auto& [tok, child] : d->children) {
        if (child->rk_in_subtree > 0) {
          next = child.get();
          break;
        }
      }
      d = next;  // non-null: rk_in_subtree > 0 and no entry here
    }
  }

  Status Check(const Node* n, size_t* nodes, size_t* edge_tokens) const {
    const Entry* own = n->entries[static_cast<int>(PayloadKind::kResidentKv)];
    uint32_t rk = own != nullptr && ServesShorterPrefixes(own->info.desc) ? 1 : 0;
    for (const auto& [tok, child] : n->children) {
      if (child->parent != n) return absl::InternalError("radix: bad parent pointer");
      if (child->edge.empty() || child->edge[0] != tok) return absl::InternalError("radix: bad edge key");
      if (child->depth != n->depth + child->edge.size()) return absl::InternalError("radix: bad depth");
      if (!child->HasEntries() && child->children.size() < 2) {
        return absl::InternalError("radix: unmerged node at depth " + std::to_string(child->depth));
      }
      for (Entry* e : child->entries) {
        if (e && e->node != child.get()) return absl::InternalError("radix: entry/node mismatch");
        if (e && e->info.tokens != child->depth) return absl::InternalError("radix: entry length");
      }
      ++*nodes;
      *edge_tokens += child->edge.size();
      SKIPPY_RETURN_IF_ERROR(Check(child.get(), nodes, edge_tokens));
      rk += child->rk_in_subtree;
    }
    if (rk != n->rk_in_subtree) return absl::InternalError("radix: rk_in_subtree mismatch");
    return absl::OkStatus();
  }

 private:
  void Prune(Node* n) {
    while (n != root_.get() && !n->HasEntries()) {
      Node* p = n->parent;
      if (n->children.empty()) {
        --nodes_;
        edge_tokens_ -= n->edge.size();
        p->children.erase(n->edge[0]);
        n = p;
        continue;
      }
      if (n->children.size() == 1) {
        // Merge n into its only child.
        std::unique_ptr<Node> c = std::move(n->children.begin()->second);
        n->children.clear();
        c->edge.insert(c->edge.begin(), n->edge.begin(), n->edge.end());
        c->parent = p;
        --nodes_;  // n disappears; its edge tokens now belong to c
        Token key = c->edge[0];
        p->children[key] = std::move(c);  // destroys n
      }
      break;
    }
  }

  std::unique_ptr<Node> root_;
  size_t nodes_ = 0;
  size_t edge_tokens_ = 0;
};

}  // namespace

struct ScopeTrees {
  PrefixScope scope;
  uint64_t fingerprint = 0;
  Tree live;
  Tree ghosts;
};

std::string_view MissReasonName(MissReason reason) {
  switch (reason) {
    case MissReason::kNeverSeen: return "never-seen";
    case MissReason::kEvicted: return "evicted";
    case MissReason::kIdentityMismatch: return "identity-mismatch";
  }
  return "unknown";
}

struct RadixIndex::Impl {
  using EvictKey = std::tuple<double, uint64_t, EntryId>;

  RadixIndexOptions options;
  absl::flat_hash_map<uint64_t, std::vector<std::unique_ptr<ScopeTrees>>> scopes;
  absl::flat_hash_map<EntryId, std::unique_ptr<Entry>> entries;  // live and zombie
  absl::flat_hash_map<EntryId, std::unique_ptr<Entry>> ghosts;
  std::deque<EntryId> ghost_fifo;
  size_t ghost_tokens = 0;
  std::set<EvictKey> evictable;
  EntryId next_id = 1;
  uint64_t clock = 0;
  RadixStats stats;  // counters; structural numbers are computed in Stats()

  ScopeTrees* FindScope(const PrefixScope& scope, uint64_t fp) const {
    auto it = scopes.find(fp);
    if (it == scopes.end()) return nullptr;
    for (const auto& s : it->second) {
      if (s->scope == scope) return s.get();
    }
    return nullptr;
  }

  ScopeTrees* GetScope(const PrefixScope& scope) {
    uint64_t fp = scope.Fingerprint();
    if (ScopeTrees* s = FindScope(scope, fp)) return s;
    auto s = std::make_unique<ScopeTrees>();
    s->scope = scope;
    s->fingerprint = fp;
    ScopeTrees* raw = s.get();
    scopes[fp].push_back(std::move(s));
    return raw;
  }

  void DropScopeIfEmpty(ScopeTrees* s) {
    if (!s->live.empty() || !s->ghosts.empty()) return;
    auto it = scopes.find(s->fingerprint);
    auto& vec = it->second;
    vec.erase(std::remove_if(vec.begin(), vec.end(), [&](const auto& p) { return p.get() == s; }),
              vec.end());
    if (vec.empty()) scopes.erase(it);
  }

  EvictKey KeyOf(const Entry& e) const {
    double prio = 0;
    if (options.policy == EvictionPolicy::kCostAware) {
      prio = e.info.desc.recompute_cost / static_cast<double>(std::max<uint64_t>(e.info.desc.bytes, 1));
    }
    return {prio, e.last_use, e.info.id};
  }

  static std::vector<Token> PathOf(const Node* n) {
    std::vector<Token> out(n->depth);
    for (; n != nullptr && n->parent != nullptr; n = n->parent) {
      std::copy(n->edge.begin(), n->edge.end(), out.begin() + (n->depth - n->edge.size()));
    }
    return out;
  }

  void AddGhost(ScopeTrees* s, const Entry& e, std::span<const Token> tokens) {
    if (options.max_ghost_entries == 0 || tokens.size() > options.max_ghost_tokens) return;
    Node* n = s->ghosts.FindOrCreate(tokens);
    int slot = static_cast<int>(e.info.desc.kind);
    if (n->entries[slot] != nullptr) return;  // already remembered
    auto g = std::make_unique<Entry>();
    g->info.id = e.info.id;
    g->info.tokens = e.info.tokens;
    g->info.desc.kind = e.info.desc.kind;
    g->info.desc.exact_only = e.info.desc.exact_only;  // it matched only its whole length, so does its ghost
    g->scope = s;
    Tree::Attach(n, g.get());
    ghost_tokens += tokens.size();
    ghost_fifo.push_back(g->info.id);
    ghosts.emplace(g->info.id, std::move(g));
    while (ghosts.size() > options.max_ghost_entries || ghost_tokens > options.max_ghost_tokens) {
      DropOldestGhost();
    }
  }

  void DropOldestGhost() {
    EntryId id = ghost_fifo.front();
    ghost_fifo.pop_front();
    auto it = ghosts.find(id);
    Entry* g = it->second.get();
    ScopeTrees* s = g->scope;
    ghost_tokens -= g->info.tokens;
    s->ghosts.Detach(g);
    ghosts.erase(it);
    DropScopeIfEmpty(s);
  }

  LookupResult Answer(const PrefixScope& scope, std::span<const Token> tokens, ScopeTrees** out_scope,
                      Entry** out_entry) const {
    LookupResult r;
    ScopeTrees* s = FindScope(scope, scope.Fingerprint());
    if (out_scope) *out_scope = s;
    if (s != nullptr && !tokens.empty()) {
      auto [e, usable] = s->live.Best(tokens, &r.path_tokens);
      if (e != nullptr) {
        r.match = Match{e->info, usable, usable == e->info.tokens};
        if (out_entry) *out_entry = e;
        return r;
      }
      if (s->ghosts.Best(tokens).first != nullptr) {
        r.miss_reason = MissReason::kEvicted;
        return r;
      }
    }
    if (!tokens.empty()) {
      for (const auto& [fp, vec] : scopes) {
        for (const auto& other : vec) {
          // Only the caller's own namespace: another tenant's prompts must not show in a miss reason.
          if (other.get() == s || other->scope.cache_namespace != scope.cache_namespace) continue;
          if (other->live.Best(tokens).first != nullptr) {
            r.miss_reason = MissReason::kIdentityMismatch;
            return r;
          }
        }
      }
    }
    r.miss_reason = MissReason::kNeverSeen;
    return r;
  }

  Entry* Get(EntryId id) const {
    auto it = entries.find(id);
    return it == entries.end() ? nullptr : it->second.get();
  }
};

RadixIndex::RadixIndex(RadixIndexOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
}

RadixIndex::~RadixIndex() = default;

StatusOr<EntryId> RadixIndex::Insert(const PrefixScope& scope, std::span<const Token> tokens,
                                     const EntryDesc& desc) {
  if (tokens.empty()) return absl::InvalidArgumentError("cannot insert an entry with no tokens");
  Impl& m = *impl_;
  ScopeTrees* s = m.GetScope(scope);
  int slot = static_cast<int>(desc.kind);
  if (const Node* existing = s->live.FindExact(tokens); existing && existing->entries[slot]) {
    return absl::FailedPreconditionError(
        "an entry of kind " + std::string(PayloadKindName(desc.kind)) + " already exists at this " +
        std::to_string(tokens.size()) + "-token boundary (entry " +
        std::to_string(existing->entries[slot]->info.id) + ")");
  }
  Node* n = s->live.FindOrCreate(tokens);
  auto e = std::make_unique<Entry>();
  e->info.id = m.next_id++;
  e->info.tokens = tokens.size();
  e->info.desc = desc;
  e->scope = s;
  e->last_use = ++m.clock;
  Tree::Attach(n, e.get());
  m.evictable.insert(m.KeyOf(*e));
  EntryId id = e->info.id;
  m.entries.emplace(id, std::move(e));
  return id;
}

LookupResult RadixIndex::Lookup(const PrefixScope& scope, std::span<const Token> tokens, bool pin) {
  Impl& m = *impl_;
  Entry* e = nullptr;
  LookupResult r = m.Answer(scope, tokens, nullptr, &e);
  if (!r.hit()) {
    ++m.stats.misses;
    switch (r.miss_reason) {
      case MissReason::kNeverSeen: ++m.stats.miss_never_seen; break;
      case MissReason::kEvicted: ++m.stats.miss_evicted; break;
      case MissReason::kIdentityMismatch: ++m.stats.miss_identity_mismatch; break;
    }
    return r;
  }
  ++m.stats.hits;
  if (e->refs == 0) m.evictable.erase(m.KeyOf(*e));
  e->last_use = ++m.clock;
  if (pin) ++e->refs;
  if (e->refs == 0) m.evictable.insert(m.KeyOf(*e));
  return r;
}

LookupResult RadixIndex::Peek(const PrefixScope& scope, std::span<const Token> tokens) const {
  return impl_->Answer(scope, tokens, nullptr, nullptr);
}

std::optional<EntryId> RadixIndex::FindExact(const PrefixScope& scope, std::span<const Token> tokens,
                                             PayloadKind kind) const {
  ScopeTrees* s = impl_->FindScope(scope, scope.Fingerprint());
  if (s == nullptr || tokens.empty()) return std::nullopt;
  const Node* n = s->live.FindExact(tokens);
  if (n == nullptr || n->entries[static_cast<int>(kind)] == nullptr) return std::nullopt;
  return n->entries[static_cast<int>(kind)]->info.id;
}

Status RadixIndex::Pin(EntryId id) {
  Impl& m = *impl_;
  Entry* e = m.Get(id);
  if (e == nullptr) return absl::NotFoundError("pin: no entry " + std::to_string(id));
  if (e->refs == 0 && e->node != nullptr) m.evictable.erase(m.KeyOf(*e));
  ++e->refs;
  return absl::OkStatus();
}

StatusOr<std::optional<EntryInfo>> RadixIndex::Unpin(EntryId id) {
  Impl& m = *impl_;
  Entry* e = m.Get(id);
  if (e == nullptr) return absl::NotFoundError("unpin: no entry " + std::to_string(id));
  if (e->refs == 0) {
    return absl::FailedPreconditionError("unpin: entry " + std::to_string(id) +
                                         " is not pinned (double release)");
  }
  --e->refs;
  if (e->refs > 0) return std::optional<EntryInfo>();
  if (e->node != nullptr) {
    m.evictable.insert(m.KeyOf(*e));
    return std::optional<EntryInfo>();
  }
  EntryInfo info = e->info;
  m.entries.erase(id);
  return std::optional<EntryInfo>(info);
}

StatusOr<std::optional<EntryInfo>> RadixIndex::Erase(EntryId id, bool evicted) {
  Impl& m = *impl_;
  Entry* e = m.Get(id);
  if (e == nullptr || e->node == nullptr) {
    return absl::NotFoundError("erase: no live entry " + std::to_string(id));
  }
  if (e->refs == 0) m.evictable.erase(m.KeyOf(*e));
  ScopeTrees* s = e->scope;
  std::vector<Token> tokens = Impl::PathOf(e->node);
  s->live.Detach(e);
  m.AddGhost(s, *e, tokens);
  m.DropScopeIfEmpty(s);
  e->scope = nullptr;
  if (evicted) ++m.stats.evictions;
  if (e->refs > 0) return std::optional<EntryInfo>();
  EntryInfo info = e->info;
  m.entries.erase(id);
  return std::optional<EntryInfo>(info);
}

const EntryInfo* RadixIndex::Find(EntryId id) const {
  Entry* e = impl_->Get(id);
  return e ? &e->info : nullptr;
}

bool RadixIndex::IsPinned(EntryId id) const {
  Entry* e = impl_->Get(id);
  return e != nullptr && e->refs > 0;
}

bool RadixIndex::IsLive(EntryId id) const {
  Entry* e = impl_->Get(id);
  return e != nullptr && e->node != nullptr;
}

std::vector<Token> RadixIndex::TokensOf(EntryId id) const {
  Entry* e = impl_->Get(id);
  if (e == nullptr || e->node == nullptr) return {};
  return Impl::PathOf(e->node);
}

void RadixIndex::ForEachEvictable(const std::function<bool(const EntryInfo&)>& visit) const {
  for (const auto& key : impl_->evictable) {
    if (!visit(impl_->Get(std::get<2>(key))->info)) return;
  }
}

RadixStats RadixIndex::Stats() const {
  const Impl& m = *impl_;
  RadixStats s = m.stats;
  s.scopes = 0;
  for (const auto& [fp, vec] : m.scopes) {
    for (const auto& sc : vec) {
      ++s.scopes;
      s.nodes += sc->live.nodes();
      s.edge_tokens += sc->live.edge_tokens();
    }
  }
  for (const auto& [id, e] : m.entries) {
    if (e->refs > 0) ++s.pinned_entries;
    if (e->node != nullptr) {
      ++s.entries;
      s.tokens += e->info.tokens;
      s.bytes += e->info.desc.bytes;
    } else {
      ++s.zombie_entries;
      s.zombie_tokens += e->info.tokens;
      s.zombie_bytes += e->info.desc.bytes;
    }
  }
  s.ghosts = m.ghosts.size();
  return s;
}

Status RadixIndex::CheckInvariants() const {
  const Impl& m = *impl_;
  for (const auto& [fp, vec] : m.scopes) {
    for (const auto& sc : vec) {
      if (sc->fingerprint != sc->scope.Fingerprint()) return absl::InternalError("radix: fingerprint");
      size_t nodes = 0, edge_tokens = 0;
      SKIPPY_RETURN_IF_ERROR(sc->live.Check(sc->live.root(), &nodes, &edge_tokens));
      if (nodes != sc->live.nodes() || edge_tokens != sc->live.edge_tokens()) {
        return absl::InternalError("radix: node/edge accounting");
      }
      nodes = edge_tokens = 0;
      SKIPPY_RETURN_IF_ERROR(sc->ghosts.Check(sc->ghosts.root(), &nodes, &edge_tokens));
    }
  }
  size_t evictable = 0;
  for (const auto& [id, e] : m.entries) {
    bool should = e->refs == 0 && e->node != nullptr;
    if (e->refs == 0 && e->node == nullptr) return absl::InternalError("radix: unpinned zombie");
    if (should) {
      ++evictable;
      if (!m.evictable.count(m.KeyOf(*e))) return absl::InternalError("radix: evictable set misses entry");
    }
  }
  if (evictable != m.evictable.size()) return absl::InternalError("radix: evictable set size");
  if (m.ghosts.size() != m.ghost_fifo.size()) return absl::InternalError("radix: ghost fifo");
  return absl::OkStatus();
}

}  // namespace skippy::cache
