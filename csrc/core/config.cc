#include "config.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace dualemb {
namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\n");
  return s.substr(b, e - b + 1);
}

}  // namespace

Config Config::parse(const std::string& text) {
  Config c;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(';', pos);
    if (end == std::string::npos) end = text.size();
    std::string item = trim(text.substr(pos, end - pos));
    pos = end + 1;
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw std::invalid_argument("malformed entry '" + item + "' (expected name=value)");
    std::string name = trim(item.substr(0, eq));
    if (c.values_.count(name)) throw std::invalid_argument("entry '" + name + "' given twice");
    c.values_[name] = trim(item.substr(eq + 1));
  }
  return c;
}

std::string Config::get_string(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

double Config::get_double(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  const char* s = it->second.c_str();
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s, &end);
  if (end == s || *end != '\0' || errno == ERANGE)
    throw std::invalid_argument("'" + name + "' must be a number, got '" + it->second + "'");
  return v;
}

long long Config::get_int(const std::string& name, long long fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  const char* s = it->second.c_str();
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s, &end, 10);
  if (end == s || *end != '\0' || errno == ERANGE)
    throw std::invalid_argument("'" + name + "' must be an integer, got '" + it->second + "'");
  return v;
}

unsigned long long Config::get_uint(const std::string& name, unsigned long long fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  const char* s = it->second.c_str();
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s || *end != '\0' || errno == ERANGE || it->second[0] == '-')
    throw std::invalid_argument("'" + name + "' must be a non-negative integer, got '" +
                                it->second + "'");
  return v;
}

bool Config::get_bool(const std::string& name, bool fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  const std::string& v = it->second;
  if (v == "1" || v == "true" || v == "True") return true;
  if (v == "0" || v == "false" || v == "False") return false;
  throw std::invalid_argument("'" + name + "' must be true or false, got '" + v + "'");
}

std::vector<float> Config::get_floats(const std::string& name) const {
  std::vector<float> out;
  auto it = values_.find(name);
  if (it == values_.end()) return out;
  const std::string& v = it->second;
  size_t pos = 0;
  while (pos < v.size()) {
    size_t end = v.find(',', pos);
    if (end == std::string::npos) end = v.size();
    std::string item = trim(v.substr(pos, end - pos));
    char* e = nullptr;
    double d = std::strtod(item.c_str(), &e);
    if (item.empty() || *e != '\0')
      throw std::invalid_argument("'" + name + "' must be comma-separated numbers, got '" + item +
                                  "'");
    out.push_back(static_cast<float>(d));
    pos = end + 1;
  }
  return out;
}

void Config::check_known(const std::set<std::string>& known, const std::string& what) const {
  for (const auto& kv : values_) {
    if (!known.count(kv.first)) {
      std::string names;
      for (const auto& k : known) names += (names.empty() ? "" : ", ") + k;
      throw std::invalid_argument("unknown " + what + " parameter '" + kv.first +
                                  "' (known: " + names + ")");
    }
  }
}

std::string format_double(double v) {
  char buf[64];
  for (int prec = 6; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof(buf), "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

}  // namespace dualemb
