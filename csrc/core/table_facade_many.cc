// table_facade_many.cc — the multi-table operations of TableFacade: one call for many tables.
//
// A model with F sparse features makes F lookups and F optimizer calls per step; each per-table
// call pays its own dispatch (an XLA custom call, a TF op) and runs alone on its thread. These
// take every table's batch at once, check them all, then run each table's per-table code as one
// task of the core's thread pool (tables in parallel; a batch large enough still splits inside
// its table). Since every table runs exactly its per-table code, the results are those of the
// per-table calls bit for bit. The rules are in table_facade.h.
#include <algorithm>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "table_facade.h"
#include "thread_pool.h"
#include "value_dtype.h"

namespace dualemb {
namespace {

std::string where(const std::vector<TableBatch>& batches, size_t i) {
  return "table " + std::to_string(i) + " of " + std::to_string(batches.size()) + " (id " +
         std::to_string(batches[i].id) + ")";
}

// Runs check(batch) on every batch before anything runs; the first failure is rethrown naming
// its position.
template <class Check>
void check_all(const std::vector<TableBatch>& batches, Check&& check) {
  for (size_t i = 0; i < batches.size(); ++i) {
    const TableBatch& b = batches[i];
    if (!b.table) throw std::invalid_argument(where(batches, i) + ": no such table");
    try {
      check(b);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(where(batches, i) + ": " + e.what());
    }
  }
}

// Runs op(batch) for every batch: one task per distinct table (its batches in list order),
// tasks on the core's pool. An error names the table it came from.
void run_all(std::vector<TableBatch>& batches, const std::function<void(TableBatch&)>& op) {
  std::vector<std::vector<size_t>> groups;
  std::unordered_map<const TableFacade*, size_t> group_of;
  for (size_t i = 0; i < batches.size(); ++i) {
    auto it = group_of.emplace(batches[i].table.get(), groups.size());
    if (it.second) groups.emplace_back();
    groups[it.first->second].push_back(i);
  }
  int threads = 1;
  for (const auto& b : batches) {
    if (b.table->num_threads() == 0) {
      threads = 0;  // all cores
      break;
    }
    threads = std::max(threads, b.table->num_threads());
  }
  parallel_for(static_cast<int64_t>(groups.size()), threads, [&](int64_t g) {
    for (size_t i : groups[static_cast<size_t>(g)]) {
      try {
        op(batches[i]);
      } catch (const std::bad_alloc&) {
        throw;  // keeps its kind (the C ABI reports DE_ERROR_NO_MEMORY)
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(where(batches, i) + ": " + e.what());
      } catch (const std::exception& e) {
        throw std::runtime_error(where(batches, i) + ": " + e.what());
      }
    }
  });
}

void require_rows(const TableBatch& b, const void* p, const char* name) {
  if (b.keys.n > 0 && p == nullptr)
    throw std::invalid_argument(std::string(name) + " pointer is null");
}

}  // namespace

void TableFacade::check_trainable() const {
  if (!value_dtype_trainable(value_dtype()))
    throw std::invalid_argument(std::string("a table of value dtype ") +
                                value_dtype_name(value_dtype()) + " cannot be trained");
  // describe() is canonical JSON whose last member is the optimizer (config.h).
  static const std::string kNone = ",\"optimizer\":null}";
  const std::string d = describe();
  if (d.size() >= kNone.size() && d.compare(d.size() - kNone.size(), kNone.size(), kNone) == 0)
    throw std::invalid_argument("apply_gradients: this table has no optimizer attached");
}

void TableFacade::find_many(std::vector<TableBatch>& batches) {
  check_all(batches, [](const TableBatch& b) {
    b.table->check_batch(b.keys);
    require_rows(b, b.values, "values");
  });
  run_all(batches, [](TableBatch& b) { b.table->find(b.keys, b.values, b.exists); });
}

void TableFacade::find_or_insert_many(std::vector<TableBatch>& batches) {
  check_all(batches, [](const TableBatch& b) {
    b.table->check_batch(b.keys);
    require_rows(b, b.values, "values");
  });
  run_all(batches,
          [](TableBatch& b) { b.evicted = b.table->find_or_insert(b.keys, b.values, b.exists); });
}

void TableFacade::apply_gradients_many(std::vector<TableBatch>& batches) {
  check_all(batches, [](const TableBatch& b) {
    b.table->check_batch(b.keys);
    require_rows(b, b.grads, "grads");
    if (b.step < 1) throw std::invalid_argument("step must be >= 1 (the 1-based update count)");
    b.table->check_trainable();
  });
  run_all(batches, [](TableBatch& b) {
    b.evicted = b.table->apply_gradients(b.keys, b.grads, b.lr, b.step);
  });
}

}  // namespace dualemb
