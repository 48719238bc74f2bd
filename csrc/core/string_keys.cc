#include "string_keys.h"

#include <algorithm>
#include <atomic>
#include <stdexcept>

#include "random.h"

namespace dualemb {
namespace {
std::atomic<int> g_id_bits{63};
constexpr uint64_t kNonNegative = static_cast<uint64_t>(INT64_MAX);
}  // namespace

int64_t string_fingerprint(const char* bytes, size_t len) {
  // FNV-1a spreads every byte (NUL included) through the state; mix64 then avalanches it, so
  // the low bits the storage and the probe use are as good as the high ones.
  uint64_t h = 0xcbf29ce484222325ULL;
  const unsigned char* p = reinterpret_cast<const unsigned char*>(bytes);
  for (size_t i = 0; i < len; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return static_cast<int64_t>(mix64(h) & kNonNegative);
}

void set_testing_string_id_bits(int bits) {
  if (bits < 1 || bits > 63) throw std::invalid_argument("string id bits must be in [1, 63]");
  g_id_bits.store(bits);
}
int testing_string_id_bits() { return g_id_bits.load(); }

StringKeys::StringKeys(int id_bits)
    : id_mask_(id_bits >= 63 ? kNonNegative : ((uint64_t(1) << id_bits) - 1)) {}

int64_t StringKeys::find(std::string_view s) const {
  auto it = by_string_.find(std::string(s));
  return it == by_string_.end() ? -1 : it->second;
}

int64_t StringKeys::find_or_add(std::string_view s, bool* added) {
  std::string key(s);
  auto it = by_string_.find(key);
  if (it != by_string_.end()) {
    *added = false;
    return it->second;
  }
  uint64_t id = static_cast<uint64_t>(string_fingerprint(s.data(), s.size())) & id_mask_;
  while (by_id_.count(static_cast<int64_t>(id))) id = (id + 1) & kNonNegative;
  // Both maps grow before either changes, so a bad_alloc leaves them consistent.
  by_id_.reserve(by_id_.size() + 1);
  auto ins = by_string_.emplace(std::move(key), static_cast<int64_t>(id)).first;
  by_id_.emplace(static_cast<int64_t>(id), &ins->first);
  key_bytes_ += static_cast<int64_t>(s.size());
  *added = true;
  return static_cast<int64_t>(id);
}

const std::string* StringKeys::string_of(int64_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

void StringKeys::remove(std::string_view s) {
  auto it = by_string_.find(std::string(s));
  if (it == by_string_.end()) return;
  by_id_.erase(it->second);
  key_bytes_ -= static_cast<int64_t>(it->first.size());
  by_string_.erase(it);
}

void StringKeys::remove_id(int64_t id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  const std::string* s = it->second;
  by_id_.erase(it);
  key_bytes_ -= static_cast<int64_t>(s->size());
  by_string_.erase(*s);
}

void StringKeys::clear() {
  // Swapped with empty maps so the buckets' memory goes back too.
  std::unordered_map<std::string, int64_t>().swap(by_string_);
  std::unordered_map<int64_t, const std::string*>().swap(by_id_);
  key_bytes_ = 0;
}

void StringKeys::keep_only(const std::vector<int64_t>& live_sorted) {
  std::vector<int64_t> dead;
  for (const auto& e : by_id_)
    if (!std::binary_search(live_sorted.begin(), live_sorted.end(), e.first)) dead.push_back(e.first);
  for (int64_t id : dead) remove_id(id);
  if (by_string_.empty()) clear();
}

std::vector<int64_t> StringKeys::ids() const {
  std::vector<int64_t> out;
  out.reserve(by_id_.size());
  for (const auto& e : by_id_) out.push_back(e.first);
  return out;
}

}  // namespace dualemb
