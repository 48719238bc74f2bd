// config.h — JSON specs: the one format the C ABI uses for table configs and optimizer specs.
//
// A spec is one JSON object (RFC 8259; no NaN/Infinity, no comments, no repeated member). The
// JSON parser is nlohmann-json, kept inside config.cc; this header is the small typed accessor
// layer the table, the initializers and the optimizers read specs through.
//
// Round trip. Every getter records the member it read into the spec's *echo*: the value exactly
// as given (a JSON integer stays an integer, a float a float, a list keeps its length), or the
// getter's fallback when the member is absent. echo() writes those members as canonical JSON, so
// describe() gives back what was given, completed with defaults.
//
// Canonical JSON text is the byte sequence Python writes with
//   json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
// (dualemb.core.spec.canonical): members sorted by name, no spaces, non-ASCII characters as
// \uXXXX escapes, floats in Python's repr form (shortest round-trip digits; exponent form below
// 1e-4 and from 1e16 on). nlohmann's own dump differs from that (1e15 is written "1e+15", DEL is
// escaped), so the canonical writer is ours.
#ifndef DUALEMB_CONFIG_H_
#define DUALEMB_CONFIG_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace dualemb {

class Config {
 public:
  // Parses `text`, which must be one JSON object. `what` names the spec in errors ("table
  // config", "optimizer spec"). Throws std::invalid_argument on malformed JSON, a value that is
  // not an object, or a member given twice.
  static Config parse(const std::string& text, const std::string& what);
  Config(Config&&) noexcept;
  Config& operator=(Config&&) noexcept;
  ~Config();

  bool has(const std::string& name) const;
  // Typed getters: `fallback` when the member is absent; std::invalid_argument naming the
  // member and the expected type when it has another type.
  std::string get_string(const std::string& name, const std::string& fallback) const;
  double get_double(const std::string& name, double fallback) const;  // finite JSON number
  long long get_int(const std::string& name, long long fallback) const;  // JSON integer, int64
  unsigned long long get_uint(const std::string& name, unsigned long long fallback) const;
  bool get_bool(const std::string& name, bool fallback) const;  // JSON true / false
  // A JSON list of finite numbers (empty if absent), each as a double and, when it is a JSON
  // integer in the int64 range, also exactly (a double holds integers only up to 2^53).
  struct Number {
    double d = 0.0;
    bool is_int = false;
    long long i = 0;
  };
  std::vector<Number> get_numbers(const std::string& name) const;
  // A JSON list of strings (`fallback` if absent).
  std::vector<std::string> get_strings(const std::string& name,
                                       const std::vector<std::string>& fallback) const;
  // A member that is itself a JSON object, as a spec of its own (`what` names it in errors); an
  // empty object if absent. The member enters this spec's echo only through set_echo (with the
  // child's echo, so its defaults are described too).
  Config get_object(const std::string& name, const std::string& what) const;
  // Throws std::invalid_argument naming the first member not in `known` (`what` names the
  // context).
  void check_known(const std::set<std::string>& known, const std::string& what) const;

  // The first member given but never read ("" if none): a member that does not apply.
  std::string first_unread() const;

  // Replaces (or adds) a member of the echo with canonical JSON text, for values the reader
  // normalises (an optimizer's canonical name).
  void set_echo(const std::string& name, const std::string& canonical_value) const;
  // Leaves a member read so far out of the echo (settings that are not part of a description).
  void drop_echo(const std::string& name) const;
  // The members read so far, as a canonical JSON object.
  std::string echo() const;

 private:
  struct Impl;
  explicit Config(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Canonical JSON text of single values (see above).
std::string canonical_json(double v);  // throws std::invalid_argument for NaN / infinity
std::string canonical_json(const std::string& s);  // s must be valid UTF-8
// Any JSON text (strict, as Config::parse) rewritten as canonical JSON text.
std::string canonical_json_text(const std::string& text);
// Whether two JSON texts hold the same value, numbers compared by value (1 == 1.0).
bool same_json(const std::string& a, const std::string& b);
// Whether two optimizer specs name the same optimizer state: equal (as same_json) once their
// "weight_decay" members are left out. Decoupled weight decay reads and writes no slot, so a
// change of it alone keeps the rows' slots (a checkpoint saved before the TF front end passed
// Keras' weight_decay to the core continues with its slots).
bool same_optimizer_state(const std::string& a, const std::string& b);

// A double for messages: the canonical text, or "nan" / "inf" / "-inf".
std::string format_double(double v);

}  // namespace dualemb

#endif  // DUALEMB_CONFIG_H_
