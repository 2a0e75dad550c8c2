#include "skippy/cache/shared_tier.h"

#include <hiredis/hiredis.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <set>
#include <string_view>

#include "skippy/common/digest.h"
#include "skippy/common/strings.h"

namespace skippy::cache {
namespace {

using Clock = std::chrono::steady_clock;

constexpr EntryFormat kManifestFormat{"SKPYSHR1", 1, /*with_blocks=*/true};
constexpr size_t kResyncBatch = 64;  // manifests per pipelined round trip

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

timeval Timeval(uint32_t ms) {
  return timeval{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
}

std::string_view StrOf(const redisReply* r) { return std::string_view(r->str, r->len); }

bool IsString(const redisReply* r) { return r != nullptr && r->type == REDIS_REPLY_STRING; }

bool IsAuthError(std::string_view message) {
  return message.starts_with("WRONGPASS") || message.starts_with("NOAUTH") ||
         message.find("invalid password") != std::string_view::npos ||
         message.find("invalid username-password") != std::string_view::npos;
}

// The hex XXH3-128 of a key part: a namespace, an identity encoding, an agreement name.
std::string HashHex(std::string_view text) { return HexOf(Hash128(std::as_bytes(std::span(text.data(), text.size())))); }

}  // namespace

// One connection to Redis with a deadline on every round trip. A failure drops the connection,
// and no new one is tried before retry_ms: callers get Unavailable at once meanwhile.
class RedisLink {
 public:
  using Command = std::vector<std::string_view>;

  explicit RedisLink(const SharedTierOptions& o) : o_(o) {}
  ~RedisLink() { Close(); }

  // Connects (and AUTHs) if not connected, every read with a deadline of `command_timeout_ms` (0:
  // the options' timeout). PermissionDenied when Redis refuses the password.
  Status Ensure(uint32_t command_timeout_ms) {
    if (ctx_ != nullptr) return absl::OkStatus();
    if (Clock::now() < retry_at_) return absl::UnavailableError(StrCat("redis ", o_.Endpoint(), ": ", last_error_));
    redisContext* c = redisConnectWithTimeout(o_.host.c_str(), o_.port, Timeval(o_.timeout_ms));
    if (c == nullptr || c->err != 0) {
      return Fail(c == nullptr ? std::string("cannot allocate a context") : std::string(c->errstr), c);
    }
    // A deadline from the first byte on (AUTH included): a Redis that accepts and never answers
    // (paused, overloaded) must not hold the caller. The event thread lifts it once subscribed.
    (void)redisSetTimeout(c, Timeval(command_timeout_ms > 0 ? command_timeout_ms : o_.timeout_ms));
    (void)redisEnableKeepAlive(c);
    ctx_ = c;
    connected_ = true;
    if (!o_.password.empty()) {
      auto r = Run({{"AUTH", o_.password}});
      if (!r.ok()) return r.status();
      const redisReply* a = (*r)[0].get();
      if (a->type == REDIS_REPLY_ERROR) {
        Close();
        retry_at_ = Clock::now() + std::chrono::milliseconds(o_.retry_ms);
        last_error_ = std::string(StrOf(a));
        return absl::PermissionDeniedError(StrCat("redis ", o_.Endpoint(), " refused the password: ", StrOf(a)));
      }
    }
    return absl::OkStatus();
  }

  // Sends the commands in one pipeline and reads every reply. Unavailable on any I/O error or
  // deadline (the connection is dropped); an error reply is a reply, for the caller to judge,
  // except an authentication error, which is PermissionDenied.
  StatusOr<std::vector<Reply>> Run(const std::vector<Command>& commands) {
    SKIPPY_RETURN_IF_ERROR(Ensure(o_.timeout_ms));
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const Command& c : commands) {
      argv.clear();
      lens.clear();
      for (std::string_view a : c) {
        argv.push_back(a.data());
        lens.push_back(a.size());
      }
      if (redisAppendCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data()) != REDIS_OK) {
        return Fail(ctx_->errstr, nullptr);
      }
    }
    std::vector<Reply> replies;
    replies.reserve(commands.size());
    for (size_t i = 0; i < commands.size(); ++i) {
      void* raw = nullptr;
      if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) {
        if (raw != nullptr) freeReplyObject(raw);
        return Fail(ctx_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK) ? "timed out"
                                                                                             : ctx_->errstr,
                    nullptr);
      }
      replies.emplace_back(static_cast<redisReply*>(raw));
      const redisReply* r = replies.back().get();
      if (r->type == REDIS_REPLY_ERROR && IsAuthError(StrOf(r))) {
        Close();
        retry_at_ = Clock::now() + std::chrono::milliseconds(o_.retry_ms);
        last_error_ = std::string(StrOf(r));
        return absl::PermissionDeniedError(StrCat("redis ", o_.Endpoint(), " refused the password: ", StrOf(r)));
      }
    }
    return replies;
  }

  redisContext* context() { return ctx_; }
  bool connected() const { return connected_.load(std::memory_order_relaxed); }
  void Close() {
    if (ctx_ != nullptr) redisFree(ctx_);
    ctx_ = nullptr;
    connected_ = false;
  }

 private:
  Status Fail(std::string why, redisContext* extra) {
    if (extra != nullptr) redisFree(extra);
    Close();
    last_error_ = std::move(why);
    retry_at_ = Clock::now() + std::chrono::milliseconds(o_.retry_ms);
    return absl::UnavailableError(StrCat("redis ", o_.Endpoint(), ": ", last_error_));
  }

  const SharedTierOptions& o_;
  redisContext* ctx_ = nullptr;
  std::atomic<bool> connected_{false};  // read without the owner's lock (Stats)
  Clock::time_point retry_at_{};
  std::string last_error_;
};

Status SharedTierOptions::Validate() const {
  if (host.empty()) return absl::InvalidArgumentError("shared tier: no Redis host");
  if (port <= 0 || port > 65535) return absl::InvalidArgumentError(StrCat("shared tier: bad Redis port ", port));
  if (key_prefix.empty() || key_prefix.find_first_of(" \r\n") != std::string::npos) {
    return absl::InvalidArgumentError("shared tier: the key prefix must be non-empty, without spaces");
  }
  if (timeout_ms == 0) return absl::InvalidArgumentError("shared tier: the timeout is 0");
  if (block_bytes < 4096) return absl::InvalidArgumentError("shared tier: blocks must be at least 4096 bytes");
  if (max_queued_bytes == 0) return absl::InvalidArgumentError("shared tier: the write queue cap is 0");
  return absl::OkStatus();
}

std::string SharedTierOptions::Endpoint() const { return StrCat(host, ":", port); }

StatusOr<std::unique_ptr<SharedTier>> SharedTier::Open(const SharedTierOptions& options,
                                                       const CacheConfigIdentity& identity) {
  SKIPPY_RETURN_IF_ERROR(options.Validate());
  SKIPPY_RETURN_IF_ERROR(identity.Validate());
  std::unique_ptr<SharedTier> tier(new SharedTier(options, identity));
  {
    std::lock_guard<std::mutex> lock(tier->read_mu_);
    // A refused or missing password is a configuration error; an unreachable Redis is not.
    if (auto s = tier->read_link_->Run({{"PING"}}); absl::IsPermissionDenied(s.status())) return s.status();
  }
  tier->writer_.Start([t = tier.get()](TierWriter::Pending p) { t->Write(std::move(p)); });
  tier->events_ = std::thread([t = tier.get()] { t->EventLoop(); });
  // Returns once the subscriber has subscribed and built the mirror (or failed to: Redis down),
  // so no entry stored after Open returns is missed. Each step has its deadline.
  std::unique_lock<std::mutex> lock(tier->mu_);
  tier->entries_cv_.wait(lock, [&] { return tier->first_sync_done_; });
  tier->stats_.loaded_at_open = tier->known_.size();
  return tier;
}

SharedTier::SharedTier(const SharedTierOptions& options, const CacheConfigIdentity& identity)
    : options_(options),
      identity_(identity),
      identity_encoding_(PrefixScope{identity, ""}.CanonicalEncoding()),
      identity_hex_(HashHex(identity_encoding_)),
      set_key_(StrCat(options_.key_prefix, ":", identity_hex_, ":set")),
      channel_(StrCat(options_.key_prefix, ":", identity_hex_, ":ev")),
      read_link_(std::make_unique<RedisLink>(options_)),
      write_link_(std::make_unique<RedisLink>(options_)),
      writer_(options.max_queued_bytes) {
  stats_.endpoint = options.Endpoint();
}

SharedTier::~SharedTier() {
  writer_.Stop();  // writes what is queued (each write bounded by its deadline)
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  {
    std::lock_guard<std::mutex> lock(event_mu_);
    if (event_fd_ >= 0) ::shutdown(event_fd_, SHUT_RDWR);  // ends the subscriber's blocking read
  }
  event_cv_.notify_all();
  if (events_.joinable()) events_.join();
}

std::string SharedTier::ManifestKey(const std::string& key) const {
  return StrCat(options_.key_prefix, ":", identity_hex_, ":m:", key);
}
std::string SharedTier::BlockKey(const std::string& ns, const Hash128Value& h) const {
  return StrCat(options_.key_prefix, ":b:", HashHex(ns), ":", HexOf(h));
}
PrefixScope SharedTier::ScopeOf(const std::string& ns) const { return PrefixScope{identity_, ns}; }

void SharedTier::Learn(const std::string& key, std::string_view manifest) {
  StatusOr<EntryHead> head = ParseEntryHead(kManifestFormat, manifest);
  std::lock_guard<std::mutex> lock(mu_);
  if (by_key_.count(key)) return;
  if (head.ok() && head->identity != identity_encoding_) {
    ++stats_.foreign;
    return;
  }
  if (head.ok() && (!ValidateTokens(identity_, head->record.tokens).ok() ||
                    HexOf(EntryKey(identity_encoding_, head->record)) != key)) {
    head = absl::DataLossError("manifest does not match its key");
  }
  if (!head.ok()) {
    ++stats_.corrupt;
    return;
  }
  EntryDesc desc;
  desc.kind = head->record.kind;
  desc.bytes = manifest.size() + head->payload_len;
  desc.exact_only = head->record.exact_only;
  desc.recompute_cost = static_cast<double>(head->record.tokens.size());
  auto id = index_.Insert(ScopeOf(head->record.tenant_namespace), head->record.tokens, desc);
  if (!id.ok()) return;
  const Hash128Value mh = Hash128(std::as_bytes(std::span(manifest.data(), manifest.size())));
  known_[*id] = Known{key, mh, std::move(*head), desc.bytes};
  by_key_[key] = *id;
  entries_cv_.notify_all();
}

void SharedTier::ForgetLocked(EntryId id) {
  auto it = known_.find(id);
  if (it == known_.end()) return;
  by_key_.erase(it->second.key);
  known_.erase(it);
  (void)index_.Erase(id, /*evicted=*/false);
}

void SharedTier::Forget(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = by_key_.find(key); it != by_key_.end()) ForgetLocked(it->second);
}

Status SharedTier::Resync() {
  std::lock_guard<std::mutex> link_lock(read_mu_);
  auto members = read_link_->Run({{"SMEMBERS", set_key_}});
  if (!members.ok()) return members.status();
  const redisReply* set = (*members)[0].get();
  if (set->type != REDIS_REPLY_ARRAY) return absl::InternalError("redis: SMEMBERS did not answer a set");
  std::set<std::string> listed;
  for (size_t i = 0; i < set->elements; ++i) {
    if (IsString(set->element[i])) listed.emplace(StrOf(set->element[i]));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<EntryId> gone;
    for (const auto& [id, k] : known_) {
      if (!listed.count(k.key)) gone.push_back(id);
    }
    for (EntryId id : gone) ForgetLocked(id);
    for (auto it = listed.begin(); it != listed.end();) it = by_key_.count(*it) ? listed.erase(it) : std::next(it);
    ++stats_.resyncs;
  }
  const std::vector<std::string> todo(listed.begin(), listed.end());
  for (size_t at = 0; at < todo.size(); at += kResyncBatch) {
    std::vector<std::string> keys;
    std::vector<RedisLink::Command> cmds;
    for (size_t i = at; i < std::min(todo.size(), at + kResyncBatch); ++i) keys.push_back(ManifestKey(todo[i]));
    for (const std::string& k : keys) cmds.push_back({"GET", k});
    auto got = read_link_->Run(cmds);
    if (!got.ok()) return got.status();
    std::vector<RedisLink::Command> stale;
    for (size_t i = 0; i < keys.size(); ++i) {
      const redisReply* r = (*got)[i].get();
      if (IsString(r)) {
        Learn(todo[at + i], StrOf(r));
      } else if (r->type == REDIS_REPLY_NIL) {
        stale.push_back({"SREM", set_key_, todo[at + i]});  // its manifest was evicted
      }
    }
    if (!stale.empty()) (void)read_link_->Run(stale);
  }
  return absl::OkStatus();
}

std::optional<TierHit> SharedTier::Lookup(const std::string& ns, std::span<const Token> tokens) {
  if (tokens.empty()) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  const LookupResult r = index_.Lookup(ScopeOf(ns), tokens, /*pin=*/false);
  if (!r.match) {
    ++(r.miss_reason == MissReason::kEvicted ? stats_.misses_evicted : stats_.misses_never_seen);
    return std::nullopt;
  }
  auto it = known_.find(r.match->entry.id);
  if (it == known_.end()) return std::nullopt;
  TierHit hit;
  hit.entry = r.match->entry.id;
  hit.usable_tokens = r.match->usable_tokens;
  hit.stored_bytes = it->second.stored_bytes;
  hit.record = it->second.head.record;
  return hit;
}

Status SharedTier::Read(const TierHit& hit, std::vector<uint8_t>& out) {
  const auto t0 = Clock::now();
  Known k;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = known_.find(hit.entry);
    if (it == known_.end()) {
      ++stats_.misses_gone;
      return absl::NotFoundError("shared entry removed since its lookup");
    }
    k = it->second;
  }
  const std::string& ns = k.head.record.tenant_namespace;
  std::vector<std::string> keys{ManifestKey(k.key)};
  for (const PayloadBlock& b : k.head.blocks) keys.push_back(BlockKey(ns, b.hash));
  std::vector<RedisLink::Command> cmds;
  for (const std::string& key : keys) cmds.push_back({"GET", key});
  StatusOr<std::vector<Reply>> got = absl::UnknownError("");
  {
    std::lock_guard<std::mutex> link_lock(read_mu_);
    got = read_link_->Run(cmds);
  }
  if (!got.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.unavailable;
    return got.status();
  }
  const redisReply* manifest = (*got)[0].get();
  auto gone = [&](std::string why) {
    Drop(k);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.misses_gone;
    return absl::NotFoundError(std::move(why));
  };
  if (!IsString(manifest)) return gone("shared entry's manifest is gone");
  if (Hash128(std::as_bytes(std::span(manifest->str, manifest->len))) != k.manifest_hash) {
    return gone("shared entry's manifest changed");
  }
  // Every block is there with its length before the payload is allocated: the manifest's lengths
  // are only as good as whoever wrote them to Redis, the replies are bytes already received.
  for (size_t i = 0; i < k.head.blocks.size(); ++i) {
    if (!IsString((*got)[i + 1].get())) return gone("a block of the shared entry is gone");
  }
  for (size_t i = 0; i < k.head.blocks.size(); ++i) {
    if ((*got)[i + 1]->len != k.head.blocks[i].len) {
      Drop(k);
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.corrupt;
      return absl::DataLossError("a block of the shared entry is not the length its manifest says");
    }
  }
  out.resize(k.head.payload_len);
  size_t at = 0;
  for (size_t i = 0; i < k.head.blocks.size(); ++i) {
    const PayloadBlock& b = k.head.blocks[i];
    const redisReply* r = (*got)[i + 1].get();
    const auto bytes = std::as_bytes(std::span(r->str, r->len));
    if (Hash128(bytes) != b.hash) {
      Drop(k);
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.corrupt;
      return absl::DataLossError("a block of the shared entry does not match its checksum");
    }
    std::memcpy(out.data() + at, r->str, r->len);
    at += r->len;
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.hits;
  stats_.read_ms += MsSince(t0);
  return absl::OkStatus();
}

void SharedTier::Drop(const Known& k) {
  Forget(k.key);
  const std::string manifest_key = ManifestKey(k.key);
  std::vector<RedisLink::Command> cmds{{"DEL", manifest_key}, {"SREM", set_key_, k.key}};
  std::vector<std::string> blocks;
  for (const PayloadBlock& b : k.head.blocks) blocks.push_back(BlockKey(k.head.record.tenant_namespace, b.hash));
  const std::string event = StrCat("R ", k.key);
  // Blocks may be shared with other entries of the namespace; only a corrupt one must go, but
  // which one is not worth a second pass: a later Read of a sibling fetches and checks its own.
  for (const std::string& b : blocks) cmds.push_back({"DEL", b});
  cmds.push_back({"PUBLISH", channel_, event});
  std::lock_guard<std::mutex> link_lock(read_mu_);
  (void)read_link_->Run(cmds);
}

bool SharedTier::Put(PrefixRecord record, std::vector<uint8_t> bytes) {
  if (record.tokens.empty() || bytes.empty()) return false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (index_.FindExact(ScopeOf(record.tenant_namespace), record.tokens, record.kind)) {
      ++stats_.write_skips;
      return false;
    }
    const uint64_t epoch = epochs_.Of(record.tenant_namespace);
    if (!writer_.Enqueue({std::move(record), std::move(bytes), epoch})) {
      ++stats_.write_drops;
      return false;
    }
  }
  return true;
}

void SharedTier::Flush() { writer_.Flush(); }

void SharedTier::Write(TierWriter::Pending p) {
  const auto t0 = Clock::now();
  const PrefixRecord& r = p.record;
  EntryHead head{identity_encoding_, r, p.bytes.size(), {}, {}};
  std::vector<std::span<const uint8_t>> pieces;
  for (size_t at = 0; at < p.bytes.size(); at += options_.block_bytes) {
    pieces.push_back(std::span(p.bytes).subspan(at, std::min<size_t>(options_.block_bytes, p.bytes.size() - at)));
    head.blocks.push_back({pieces.back().size(), Hash128(std::as_bytes(pieces.back()))});
  }
  head.payload_hash = Hash128(std::as_bytes(std::span(p.bytes)));
  const std::string manifest = EncodeEntryHead(kManifestFormat, head);
  const std::string key = HexOf(EntryKey(identity_encoding_, r));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (epochs_.Of(r.tenant_namespace) != p.epoch || by_key_.count(key)) {
      ++stats_.write_skips;
      return;
    }
  }
  auto count = [&](uint64_t SharedTierStats::*field) {
    std::lock_guard<std::mutex> lock(mu_);
    ++(stats_.*field);
  };
  std::vector<std::string> block_keys;
  std::vector<RedisLink::Command> exists;
  for (const PayloadBlock& b : head.blocks) block_keys.push_back(BlockKey(r.tenant_namespace, b.hash));
  for (const std::string& k : block_keys) exists.push_back({"EXISTS", k});
  auto have = write_link_->Run(exists);
  if (!have.ok()) return count(&SharedTierStats::write_drops);
  std::vector<RedisLink::Command> cmds;
  uint64_t sent = 0;
  for (size_t i = 0; i < block_keys.size(); ++i) {
    if ((*have)[i]->type == REDIS_REPLY_INTEGER && (*have)[i]->integer == 1) continue;
    cmds.push_back({"SET", block_keys[i],
                    std::string_view(reinterpret_cast<const char*>(pieces[i].data()), pieces[i].size())});
    ++sent;
  }
  const std::string manifest_key = ManifestKey(key);
  const std::string event = StrCat("S ", key);
  cmds.push_back({"SET", manifest_key, manifest});
  cmds.push_back({"SADD", set_key_, key});
  cmds.push_back({"PUBLISH", channel_, event});
  auto done = write_link_->Run(cmds);
  if (!done.ok()) return count(&SharedTierStats::write_drops);
  for (const Reply& reply : *done) {
    if (reply->type == REDIS_REPLY_ERROR) return count(&SharedTierStats::write_errors);  // e.g. OOM
  }
  bool cleared = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cleared = epochs_.Of(r.tenant_namespace) != p.epoch;
    ++stats_.writes;
    stats_.blocks_written += sent;
    stats_.blocks_deduplicated += head.blocks.size() - sent;
    stats_.write_ms += MsSince(t0);
  }
  if (cleared) {  // a Clear came while it was written: take it back
    (void)write_link_->Run({{"DEL", manifest_key}, {"SREM", set_key_, key}});
    return;
  }
  Learn(key, manifest);
}

size_t SharedTier::Clear(const std::optional<std::string>& ns) {
  std::vector<Known> removed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    epochs_.Raise(ns);
    std::vector<EntryId> ids;
    for (const auto& [id, k] : known_) {
      if (!ns || k.head.record.tenant_namespace == *ns) ids.push_back(id);
    }
    for (EntryId id : ids) {
      removed.push_back(known_.at(id));
      ForgetLocked(id);
    }
  }
  std::vector<std::string> keys;
  std::vector<std::string> members;
  for (const Known& k : removed) {
    keys.push_back(ManifestKey(k.key));
    members.push_back(k.key);
    for (const PayloadBlock& b : k.head.blocks) keys.push_back(BlockKey(k.head.record.tenant_namespace, b.hash));
  }
  std::vector<RedisLink::Command> cmds;
  for (const std::string& k : keys) cmds.push_back({"DEL", k});
  for (const std::string& m : members) cmds.push_back({"SREM", set_key_, m});
  const std::string event = StrCat("C ", ns ? HashHex(*ns) : std::string("*"));
  cmds.push_back({"PUBLISH", channel_, event});
  std::lock_guard<std::mutex> link_lock(read_mu_);
  (void)read_link_->Run(cmds);
  return removed.size();
}

void SharedTier::OnEvent(std::string_view m) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.events;
  }
  if (m.size() < 3 || m[1] != ' ') return;
  const std::string arg(m.substr(2));
  switch (m[0]) {
    case 'S': {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (by_key_.count(arg)) return;
      }
      StatusOr<std::vector<Reply>> got = absl::UnknownError("");
      {
        std::lock_guard<std::mutex> link_lock(read_mu_);
        got = read_link_->Run({{"GET", ManifestKey(arg)}});
      }
      if (got.ok() && IsString((*got)[0].get())) Learn(arg, StrOf((*got)[0].get()));
      return;
    }
    case 'R':
      Forget(arg);
      return;
    case 'C': {
      std::lock_guard<std::mutex> lock(mu_);
      if (arg == "*") epochs_.Raise(std::nullopt);
      std::vector<EntryId> ids;
      for (const auto& [id, k] : known_) {
        const std::string& ns = k.head.record.tenant_namespace;
        if (arg == "*" || HashHex(ns) == arg) ids.push_back(id);
      }
      for (EntryId id : ids) {
        if (arg != "*") epochs_.Raise(known_.at(id).head.record.tenant_namespace);
        ForgetLocked(id);
      }
      return;
    }
    default:
      return;
  }
}

void SharedTier::EventLoop() {
  RedisLink link(options_);
  auto stopping = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    return stop_;
  };
  while (!stopping()) {
    Status s = link.Ensure(options_.timeout_ms);
    if (s.ok()) {
      std::lock_guard<std::mutex> lock(event_mu_);
      event_fd_ = link.context()->fd;
    }
    if (s.ok() && stopping()) break;
    const std::string channel = channel_;
    const char* argv[] = {"SUBSCRIBE", channel.c_str()};
    const size_t lens[] = {9, channel.size()};
    void* raw = nullptr;
    s.Update(link.context() == nullptr ? absl::UnavailableError("no connection") : absl::OkStatus());
    if (s.ok()) (void)redisSetTimeout(link.context(), Timeval(options_.timeout_ms));  // the reply has a deadline
    if (s.ok() && ((raw = redisCommandArgv(link.context(), 2, argv, lens)) == nullptr ||
                   static_cast<redisReply*>(raw)->type == REDIS_REPLY_ERROR)) {
      s = absl::UnavailableError("subscribe failed");
    }
    if (raw != nullptr) freeReplyObject(raw);
    // Subscribed first, then rebuilt: an event sent in between is not lost. A rebuild that
    // fails means the mirror may be stale: reconnect and rebuild again.
    if (s.ok()) s = Resync();
    if (s.ok()) (void)redisSetTimeout(link.context(), timeval{0, 0});  // events: wait without a deadline
    connected_ = s.ok();
    {
      std::lock_guard<std::mutex> lock(mu_);
      first_sync_done_ = true;
    }
    entries_cv_.notify_all();
    while (s.ok()) {
      raw = nullptr;
      if (redisGetReply(link.context(), &raw) != REDIS_OK || raw == nullptr) break;
      Reply r(static_cast<redisReply*>(raw));
      if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 && IsString(r->element[2])) OnEvent(StrOf(r->element[2]));
    }
    {
      std::lock_guard<std::mutex> lock(event_mu_);
      event_fd_ = -1;
    }
    connected_ = false;
    link.Close();
    std::unique_lock<std::mutex> lock(event_mu_);
    event_cv_.wait_for(lock, std::chrono::milliseconds(options_.retry_ms), [&] {
      std::lock_guard<std::mutex> l2(mu_);
      return stop_;
    });
  }
}

bool SharedTier::WaitForEntries(size_t n, uint32_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return entries_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return known_.size() >= n; });
}

SharedTierStats SharedTier::Stats() const {
  SharedTierStats s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = stats_;
    s.entries = known_.size();
  }
  s.connected = connected_.load();
  s.queued_bytes = writer_.queued_bytes();
  return s;
}

// ---------------------------------------------------------------------------------------------
// SharedAgreement

SharedAgreement::SharedAgreement(const SharedTierOptions& options)
    : options_(options), link_(std::make_unique<RedisLink>(options_)) {}

SharedAgreement::~SharedAgreement() = default;

std::string SharedAgreement::KeyOf(std::string_view name) const {
  return StrCat(options_.key_prefix, ":agree:", HashHex(name));
}

StatusOr<std::optional<std::string>> SharedAgreement::Get(std::string_view name) {
  const std::string key = KeyOf(name);
  SKIPPY_ASSIGN_OR_RETURN(auto replies, link_->Run({{"GET", key}}));
  const redisReply* r = replies[0].get();
  if (r->type == REDIS_REPLY_NIL) return std::optional<std::string>();
  if (!IsString(r)) return absl::UnavailableError(StrCat("redis ", options_.Endpoint(), ": GET ", key, ": ", StrOf(r)));
  return std::optional<std::string>(std::string(StrOf(r)));
}

StatusOr<std::string> SharedAgreement::Propose(std::string_view name, std::string_view proposal) {
  const std::string key = KeyOf(name);
  SKIPPY_ASSIGN_OR_RETURN(auto replies, link_->Run({{"SET", key, proposal, "NX"}, {"GET", key}}));
  const redisReply* got = replies[1].get();
  if (!IsString(got)) {
    // An error reply (out of memory under noeviction ...) or a value gone between the two commands.
    const redisReply* set = replies[0].get();
    return absl::UnavailableError(StrCat("redis ", options_.Endpoint(), ": SET NX ", key, ": ",
                                         set->type == REDIS_REPLY_ERROR ? StrOf(set) : StrOf(got)));
  }
  return std::string(StrOf(got));
}

}  // namespace skippy::cache
