#include "registry.h"

#include <mutex>
#include <random>
#include <stdexcept>
#include <unordered_map>

#include "random.h"
#include "value_dtype.h"

namespace dualemb {
namespace {

struct Entry {
  std::shared_ptr<TableFacade> table;
  int64_t owners = 1;
};

struct Registry {
  std::mutex mu;
  std::unordered_map<int64_t, Entry> tables;
  uint64_t counter = 0;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: tables may be used at exit
  return *r;
}

int64_t fresh_id(Registry& r) {
  static const uint64_t salt = (static_cast<uint64_t>(std::random_device{}()) << 32) ^
                               std::random_device{}();
  for (;;) {
    int64_t id = static_cast<int64_t>(mix64(salt + ++r.counter) >> 1);
    if (id != 0 && !r.tables.count(id)) return id;
  }
}

}  // namespace

int64_t create_table(int64_t id, const std::string& config) {
  if (id < 0) throw std::invalid_argument("table id must be a non-negative 63-bit integer");
  auto table = std::make_shared<TableFacade>(config);  // validates config first
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (id == 0) id = fresh_id(r);
  auto it = r.tables.find(id);
  if (it != r.tables.end()) {
    const TableFacade& t = *it->second.table;
    // A different value dtype would make callers read rows in the wrong element type.
    if (t.dim() != table->dim() || t.key_dtype() != table->key_dtype() ||
        t.value_dtype() != table->value_dtype())
      throw std::invalid_argument("table " + std::to_string(id) + " exists with dim " +
                                  std::to_string(t.dim()) + ", value dtype " +
                                  value_dtype_name(t.value_dtype()) + " and another config");
    return id;
  }
  r.tables.emplace(id, Entry{std::move(table), 1});
  return id;
}

[[noreturn]] static void throw_unknown(int64_t id) {
  throw std::out_of_range("unknown table id " + std::to_string(id) +
                          " (not created or loaded in this process, or already freed)");
}

int64_t clone_table(int64_t id) {
  // Copied outside the registry's lock: a big table takes a while, and other tables stay usable.
  std::shared_ptr<TableFacade> copy = get_table(id)->clone();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const int64_t fresh = fresh_id(r);
  r.tables.emplace(fresh, Entry{std::move(copy), 1});
  return fresh;
}

std::shared_ptr<TableFacade> get_table(int64_t id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.tables.find(id);
  if (it == r.tables.end()) throw_unknown(id);
  return it->second.table;
}

void retain_table(int64_t id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.tables.find(id);
  if (it == r.tables.end()) throw_unknown(id);
  ++it->second.owners;
}

bool release_table(int64_t id) {
  std::shared_ptr<TableFacade> last;  // freed after the lock is released: freeing a big table is slow
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.tables.find(id);
    if (it == r.tables.end()) return false;
    if (--it->second.owners > 0) return true;
    last = std::move(it->second.table);
    r.tables.erase(it);
  }
  return true;
}

bool table_exists(int64_t id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.tables.count(id) > 0;
}

bool destroy_table(int64_t id) {
  std::shared_ptr<TableFacade> last;  // freed after the lock is released
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.tables.find(id);
    if (it == r.tables.end()) return false;
    last = std::move(it->second.table);
    r.tables.erase(it);
  }
  return true;
}

}  // namespace dualemb
