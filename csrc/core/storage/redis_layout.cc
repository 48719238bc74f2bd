// redis_layout.cc — where a Redis table's keys are (docs/redis.md "Layout in Redis"): the
// names of its slices, and, for a new table in a Cluster, the hash tags that spread them over
// the masters.
#ifdef DUALEMB_HAVE_HIREDIS
#include "../hash.h"
#include "redis_table.h"

namespace dualemb {

std::string RedisTable::slice_key(size_t slice, char kind) const {
  return bases_[slice] + ":" + kind + std::to_string(slice);
}

void RedisTable::set_layout(const std::string& slice_tags) {
  // No tags: every slice in meta's slot, named as dualemb always named them (de:{id}:b<i>).
  bases_.assign(slices_, prefix_);
  spread_ = !slice_tags.empty();
  if (spread_) {
    size_t at = 0;
    for (int64_t i = 0; i < slices_; ++i) {
      const size_t comma = slice_tags.find(',', at);
      const std::string t =
          slice_tags.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
      if (t.empty() || t.find_first_not_of("0123456789") != std::string::npos ||
          (comma == std::string::npos) != (i + 1 == slices_))
        throw RedisError("redis table " + prefix_ + ": meta's slice_tags '" + slice_tags +
                         "' does not list " + std::to_string(slices_) + " slices");
      bases_[i] = "de:{" + t + "}:" + ident_;
      at = comma + 1;
    }
  }
  buckets_.clear();
  slice_slot_.clear();
  for (int64_t i = 0; i < slices_; ++i) {
    buckets_.push_back(slice_key(i, 'b'));
    slice_slot_.push_back(redis_key_slot(buckets_.back()));
  }
}

std::string RedisTable::choose_slice_tags() const {
  // Slice i goes to master (i + h) % M (masters ordered by their first slot; h from the table's
  // identity, so tables do not all start on the first master), and within a master to slots
  // spaced evenly over the slots it serves. The tag is a number whose CRC16 is that slot.
  const std::vector<std::vector<int>> masters = router_->master_slots();
  if (masters.empty()) throw RedisError("redis cluster: CLUSTER SLOTS lists no master");
  uint64_t fnv = 1469598103934665603ull;  // FNV-1a of the identity: the same on every machine
  for (unsigned char ch : ident_) fnv = (fnv ^ ch) * 1099511628211ull;
  const uint64_t h = hash_key(static_cast<int64_t>(fnv));
  const int64_t m_count = static_cast<int64_t>(masters.size());
  std::string tags;
  for (int64_t i = 0; i < slices_; ++i) {
    const int64_t m = static_cast<int64_t>((static_cast<uint64_t>(i) + h) % m_count);
    const int64_t pos = (m - static_cast<int64_t>(h % m_count) + m_count) % m_count;
    const int64_t on_m = slices_ / m_count + (pos < slices_ % m_count ? 1 : 0);
    const int64_t j = i / m_count;  // this slice's place among those on master m
    const auto& slots = masters[m];
    const int64_t n = static_cast<int64_t>(slots.size());
    const int64_t idx = static_cast<int64_t>(((h >> 20) + static_cast<uint64_t>(j * n / on_m)) % n);
    tags += (i ? "," : "") + redis_tag_for_slot(slots[idx]);
  }
  return tags;
}

}  // namespace dualemb
#endif  // DUALEMB_HAVE_HIREDIS
