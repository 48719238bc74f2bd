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

StringKeys::StringKeys(const StringKeys& o)
    : id_mask_(o.id_mask_), by_id_(o.by_id_), key_bytes_(o.key_bytes_) {
  by_string_.reserve(by_id_.size());
  for (const auto& [id, s] : by_id_) by_string_.emplace(std::string_view(s), id);
}

int64_t StringKeys::find(std::string_view s) const {
  auto it = by_string_.find(s);
  return it == by_string_.end() ? -1 : it->second;
}

int64_t StringKeys::find_or_add(std::string_view s, bool* added) {
  auto found = by_string_.find(s);
  if (found != by_string_.end()) {
    *added = false;
    return found->second;
  }
  uint64_t id = static_cast<uint64_t>(string_fingerprint(s.data(), s.size())) & id_mask_;
  while (by_id_.count(static_cast<int64_t>(id))) id = (id + 1) & kNonNegative;
  auto it = by_id_.emplace(static_cast<int64_t>(id), std::string(s)).first;
  try {
    by_string_.emplace(std::string_view(it->second), static_cast<int64_t>(id));
  } catch (...) {  // keep the two maps consistent
    by_id_.erase(it);
    throw;
  }
  key_bytes_ += static_cast<int64_t>(s.size());
  *added = true;
  return static_cast<int64_t>(id);
}

void StringKeys::reserve_more(size_t n) {
  const size_t want = by_id_.size() + n;
  // Only when growth is due: reserve() to a smaller count could shrink (rehash) the table.
  if (want > by_id_.bucket_count() * by_id_.max_load_factor()) {
    by_id_.reserve(want);
    by_string_.reserve(want);
  }
}

const std::string* StringKeys::string_of(int64_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

void StringKeys::remove(std::string_view s) {
  auto it = by_string_.find(s);
  if (it != by_string_.end()) remove_id(it->second);
}

void StringKeys::remove_id(int64_t id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  key_bytes_ -= static_cast<int64_t>(it->second.size());
  by_string_.erase(std::string_view(it->second));  // before the string it views goes
  by_id_.erase(it);
}

void StringKeys::clear() {
  // Swapped with empty maps so the buckets' memory goes back too.
  std::unordered_map<std::string_view, int64_t>().swap(by_string_);
  std::unordered_map<int64_t, std::string>().swap(by_id_);
  key_bytes_ = 0;
}

void StringKeys::keep_only(const std::vector<int64_t>& live_sorted) {
  std::vector<int64_t> dead;
  for (const auto& e : by_id_)
    if (!std::binary_search(live_sorted.begin(), live_sorted.end(), e.first)) dead.push_back(e.first);
  for (int64_t id : dead) remove_id(id);
  if (by_id_.empty()) clear();
}

std::vector<int64_t> StringKeys::ids() const {
  std::vector<int64_t> out;
  out.reserve(by_id_.size());
  for (const auto& e : by_id_) out.push_back(e.first);
  return out;
}

}  // namespace dualemb
