// config.h — "name=value;name=value" strings: the one format the C ABI uses for table configs
// and optimizer specs (POD across the ABI, readable in a manifest, easy to extend).
#ifndef DUALEMB_CONFIG_H_
#define DUALEMB_CONFIG_H_

#include <map>
#include <set>
#include <string>
#include <vector>

namespace dualemb {

class Config {
 public:
  // Throws std::invalid_argument on a malformed or repeated entry.
  static Config parse(const std::string& text);

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string get_string(const std::string& name, const std::string& fallback) const;
  double get_double(const std::string& name, double fallback) const;
  long long get_int(const std::string& name, long long fallback) const;
  unsigned long long get_uint(const std::string& name, unsigned long long fallback) const;
  bool get_bool(const std::string& name, bool fallback) const;
  std::vector<float> get_floats(const std::string& name) const;
  // Throws std::invalid_argument naming the first entry not in `known` (`what` names the context).
  void check_known(const std::set<std::string>& known, const std::string& what) const;

 private:
  std::map<std::string, std::string> values_;
};

// Formats a double so that parsing it back gives the same value (shortest round-trip form).
std::string format_double(double v);

}  // namespace dualemb

#endif  // DUALEMB_CONFIG_H_
