// copy_members.h — member types that let a table class keep a defaulted copy constructor.
//
// A table is copied by Storage::clone (storage/storage.h) for a consistent snapshot (a background
// checkpoint writes the copy while training goes on). The copy is the class's own defaulted copy
// constructor, run under the source's lock, so every member — including ones added later —
// is copied without a hand-written member list that could forget one. The few members whose
// plain copy would be wrong or impossible use these types:
//  * FreshSharedMutex: a lock is not state; a copy gets a fresh, unlocked one;
//  * CopiedAtomic<T>: an atomic counter, copied by value (the source's lock is held, so the
//    value is the one as of the copy);
//  * DeepPtr<T>: an owned object (a shard) copied into a new object, not shared;
//  * ParallelCopiedPtrs<T>: a vector of DeepPtr<T> (the shards) whose copy copies the objects
//    in parallel, one pool task each (thread_pool.h): writers wait while a table is copied, and
//    a copy is mostly page faults of the fresh memory, which scale with the cores.
#ifndef DUALEMB_COPY_MEMBERS_H_
#define DUALEMB_COPY_MEMBERS_H_

#include <atomic>
#include <memory>
#include <shared_mutex>
#include <utility>
#include <vector>

#include "thread_pool.h"

namespace dualemb {

class FreshSharedMutex : public std::shared_mutex {
 public:
  FreshSharedMutex() = default;
  FreshSharedMutex(const FreshSharedMutex&) : std::shared_mutex() {}
  FreshSharedMutex& operator=(const FreshSharedMutex&) = delete;
};

template <class T>
class CopiedAtomic : public std::atomic<T> {
 public:
  CopiedAtomic() : std::atomic<T>(T{}) {}
  explicit CopiedAtomic(T v) : std::atomic<T>(v) {}
  CopiedAtomic(const CopiedAtomic& o) : std::atomic<T>(o.load()) {}
  CopiedAtomic& operator=(const CopiedAtomic&) = delete;
  using std::atomic<T>::operator=;
};

// A unique_ptr whose copy is a new T copied from the pointee (T's own copy constructor).
template <class T>
class DeepPtr {
 public:
  DeepPtr() = default;
  explicit DeepPtr(T* p) : p_(p) {}
  DeepPtr(DeepPtr&&) noexcept = default;
  DeepPtr& operator=(DeepPtr&&) noexcept = default;
  DeepPtr(const DeepPtr& o) : p_(o.p_ ? new T(*o.p_) : nullptr) {}
  DeepPtr& operator=(const DeepPtr&) = delete;

  T* get() const { return p_.get(); }
  T& operator*() const { return *p_; }
  T* operator->() const { return p_.get(); }
  explicit operator bool() const { return static_cast<bool>(p_); }

 private:
  std::unique_ptr<T> p_;
};

template <class T>
class ParallelCopiedPtrs : public std::vector<DeepPtr<T>> {
 public:
  ParallelCopiedPtrs() = default;
  ParallelCopiedPtrs(ParallelCopiedPtrs&&) noexcept = default;
  ParallelCopiedPtrs& operator=(ParallelCopiedPtrs&&) noexcept = default;
  // Every element is copied before this returns; if one copy throws, the copies made are freed
  // (the base vector's destructor) and the first exception is rethrown.
  ParallelCopiedPtrs(const ParallelCopiedPtrs& o) : std::vector<DeepPtr<T>>(o.size()) {
    std::vector<DeepPtr<T>>& self = *this;
    parallel_for(static_cast<int64_t>(o.size()), 0, [&](int64_t i) {
      if (o[i]) self[i] = DeepPtr<T>(new T(*o[i]));
    });
  }
  ParallelCopiedPtrs& operator=(const ParallelCopiedPtrs&) = delete;
};

}  // namespace dualemb

#endif  // DUALEMB_COPY_MEMBERS_H_
