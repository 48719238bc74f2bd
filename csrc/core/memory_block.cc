#include "memory_block.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace dualemb {
namespace {

size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

// The first number in a file (cgroup limits), or 0 if it is absent or says "max".
uint64_t read_limit(const char* path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s == "max") return 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  return end && *end == '\0' ? static_cast<uint64_t>(v) : 0;
}

uint64_t compute_limit() {
  uint64_t phys = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * page_size();
  uint64_t limit = phys;
  // cgroup v2, then v1 (which reports a huge number when unlimited).
  for (const char* p : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    uint64_t v = read_limit(p);
    if (v > 0 && v < limit) limit = v;
  }
  return limit;
}

std::string human(long double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.0Lf bytes (%.2Lf GiB)", bytes, bytes / (1024.0L * 1024 * 1024));
  return buf;
}

}  // namespace

void* allocate_block(size_t bytes, bool prefault) {
  if (bytes >= kMapThreshold) {
    const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (prefault ? MAP_POPULATE : 0);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED) throw OutOfMemory("out of memory: could not map " + human(bytes));
    return p;
  }
  void* p = std::malloc(bytes ? bytes : 1);
  if (!p) throw OutOfMemory("out of memory: could not allocate " + human(bytes));
  return p;
}

void release_block(void* p, size_t bytes) noexcept {
  if (!p) return;
  if (bytes >= kMapThreshold) munmap(p, bytes);
  else std::free(p);
}

size_t block_footprint(size_t bytes) {
  if (bytes < kMapThreshold) return bytes;
  const size_t ps = page_size();
  return (bytes + ps - 1) / ps * ps;
}

uint64_t memory_limit_bytes() {
  static const uint64_t limit = compute_limit();
  return limit;
}

void check_request(const char* what, long double bytes) {
  const uint64_t limit = memory_limit_bytes();
  if (bytes > static_cast<long double>(limit))
    throw OutOfMemory(std::string(what) + " needs " + human(bytes) +
                      ", more than this machine's memory limit of " + human(limit));
}

}  // namespace dualemb
