#include "config.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <system_error>

#include <nlohmann/json.hpp>

namespace dualemb {

using Json = nlohmann::json;

namespace {

const char* type_name(const Json& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number_float()) return "a float";
  if (v.is_boolean()) return "a boolean";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "a list";
  if (v.is_object()) return "an object";
  return "null";
}

void append_hex4(std::string& out, unsigned v) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "\\u%04x", v & 0xFFFFu);
  out += buf;
}

// Python's json.dumps(s, ensure_ascii=True): printable ASCII as is, the short escapes, every
// other character as \uXXXX (UTF-16 surrogate pairs above U+FFFF).
void write_string(const std::string& s, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
          if (c >= 0x20 && c <= 0x7e) out += static_cast<char>(c);
          else append_hex4(out, c);
      }
      continue;
    }
    int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (len == 0 || i + len > s.size())
      throw std::invalid_argument("spec string is not valid UTF-8");
    unsigned cp = c & (0x7F >> len);
    for (int k = 1; k < len; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) throw std::invalid_argument("spec string is not valid UTF-8");
      cp = (cp << 6) | (cc & 0x3F);
    }
    i += len;
    if (cp >= 0x10000) {
      cp -= 0x10000;
      append_hex4(out, 0xD800 + (cp >> 10));
      append_hex4(out, 0xDC00 + (cp & 0x3FF));
    } else {
      append_hex4(out, cp);
    }
  }
  out += '"';
}

// Python's float repr: the shortest digits that read back to the same double, in fixed notation
// when the decimal exponent is in [-4, 16), else d.ddde+XX.
void write_double(double v, std::string& out) {
  if (!std::isfinite(v))
    throw std::invalid_argument("non-finite number " + format_double(v) +
                                " (JSON specs hold finite numbers only)");
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  if (res.ec != std::errc()) throw std::runtime_error("to_chars failed");
  std::string sci(buf, res.ptr);  // [-]d[.ddd]e[+-]XX
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp10 = std::stoi(sci.substr(e + 1));
  if (!mant.empty() && mant[0] == '-') {
    out += '-';
    mant.erase(0, 1);
  }
  std::string digits;
  for (char ch : mant)
    if (ch != '.') digits += ch;
  const int n = static_cast<int>(digits.size());
  const int decpt = exp10 + 1;  // value = 0.digits * 10^decpt
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(-decpt, '0') + digits;
    } else if (decpt >= n) {
      out += digits + std::string(decpt - n, '0') + ".0";
    } else {
      out += digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
    return;
  }
  out += digits.substr(0, 1);
  if (n > 1) out += "." + digits.substr(1);
  const int x = decpt - 1;
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
  out += ebuf;
}

void write_canonical(const Json& v, std::string& out) {
  switch (v.type()) {
    case Json::value_t::null: out += "null"; return;
    case Json::value_t::boolean: out += v.get<bool>() ? "true" : "false"; return;
    case Json::value_t::number_integer: out += std::to_string(v.get<int64_t>()); return;
    case Json::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); return;
    case Json::value_t::number_float: write_double(v.get<double>(), out); return;
    case Json::value_t::string: write_string(v.get_ref<const std::string&>(), out); return;
    case Json::value_t::array: {
      out += '[';
      bool first = true;
      for (const Json& item : v) {
        if (!first) out += ',';
        first = false;
        write_canonical(item, out);
      }
      out += ']';
      return;
    }
    case Json::value_t::object: {  // nlohmann's object is a std::map: sorted by UTF-8 bytes,
      out += '{';                  // which is Python's code-point order
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ',';
        first = false;
        write_string(it.key(), out);
        out += ':';
        write_canonical(it.value(), out);
      }
      out += '}';
      return;
    }
    default:
      throw std::invalid_argument("spec holds a value JSON cannot represent");
  }
}

// Parses strict JSON, refusing a member repeated within one object (the parser would otherwise
// keep the last silently).
Json parse_strict(const std::string& text, const std::string& what) {
  std::vector<std::set<std::string>> open;
  auto check = [&](int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      open.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      open.pop_back();
    } else if (event == Json::parse_event_t::key) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!open.back().insert(key).second)
        throw std::invalid_argument(what + ": member '" + key + "' given twice");
    }
    return true;
  };
  try {
    return Json::parse(text, check);
  } catch (const Json::exception& e) {
    throw std::invalid_argument(what + " is not valid JSON (" + e.what() + "): '" + text + "'");
  }
}

}  // namespace

struct Config::Impl {
  std::string what;
  Json value;         // the parsed object
  mutable Json echo;  // the members read so far
  mutable std::set<std::string> read;  // their names (also those dropped from the echo)

  void record(const std::string& name, Json v) const {
    read.insert(name);
    echo[name] = std::move(v);
  }
};

Config::Config(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Config::Config(Config&&) noexcept = default;
Config& Config::operator=(Config&&) noexcept = default;
Config::~Config() = default;

Config Config::parse(const std::string& text, const std::string& what) {
  auto impl = std::make_unique<Impl>();
  impl->what = what;
  impl->value = parse_strict(text, what);
  if (!impl->value.is_object())
    throw std::invalid_argument(what + " must be a JSON object, got " +
                                type_name(impl->value) + ": '" + text + "'");
  impl->echo = Json::object();
  return Config(std::move(impl));
}

bool Config::has(const std::string& name) const { return impl_->value.contains(name); }

namespace {

[[noreturn]] void wrong_type(const std::string& what, const std::string& name, const char* want,
                             const Json& got) {
  std::string text;
  try {
    write_canonical(got, text);
  } catch (const std::exception&) {
    text = got.dump();
  }
  throw std::invalid_argument(what + ": '" + name + "' must be " + want + ", got " +
                              type_name(got) + " " + text);
}

}  // namespace

std::string Config::get_string(const std::string& name, const std::string& fallback) const {
  auto it = impl_->value.find(name);
  if (it == impl_->value.end()) {
    impl_->record(name, fallback);
    return fallback;
  }
  if (!it->is_string()) wrong_type(impl_->what, name, "a string", *it);
  impl_->record(name, *it);
  return it->get<std::string>();
}

double Config::get_double(const std::string& name, double fallback) const {
  auto it = impl_->value.find(name);
  if (it == impl_->value.end()) {
    impl_->record(name, fallback);
    return fallback;
  }
  if (!it->is_number()) wrong_type(impl_->what, name, "a number", *it);
  const double v = it->get<double>();
  if (!std::isfinite(v)) wrong_type(impl_->what, name, "a finite number", *it);
  impl_->record(name, *it);
  return v;
}

long long Config::get_int(const std::string& name, long long fallback) const {
  auto it = impl_->value.find(name);
  if (it == impl_->value.end()) {
    impl_->record(name, static_cast<int64_t>(fallback));
    return fallback;
  }
  if (!it->is_number_integer() ||
      (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)))
    wrong_type(impl_->what, name, "an integer in the int64 range", *it);
  impl_->record(name, *it);
  return it->get<int64_t>();
}

unsigned long long Config::get_uint(const std::string& name,
                                    unsigned long long fallback) const {
  auto it = impl_->value.find(name);
  if (it == impl_->value.end()) {
    impl_->record(name, static_cast<uint64_t>(fallback));
    return fallback;
  }
  // nlohmann stores a non-negative JSON integer as unsigned, a negative one as signed.
  if (!it->is_number_unsigned())
    wrong_type(impl_->what, name, "an integer in [0, 2**64)", *it);
  impl_->record(name, *it);
  return it->get<uint64_t>();
}

bool Config::get_bool(const std::string& name, bool fallback) const {
  auto it = impl_->value.find(name);
  if (it == impl_->value.end()) {
    impl_->record(name, fallback);
    return fallback;
  }
  if (!it->is_boolean()) wrong_type(impl_->what, name, "true or false", *it);
  impl_->record(name, *it);
  return it->get<bool>();
}

std::vector<Config::Number> Config::get_numbers(const std::string& name) const {
  std::vector<Number> out;
  auto it = impl_->value.find(name);
  if (it == impl_->value.end()) return out;
  if (!it->is_array()) wrong_type(impl_->what, name, "a list of numbers", *it);
  for (const Json& item : *it) {
    if (!item.is_number() || !std::isfinite(item.get<double>()))
      wrong_type(impl_->what, name, "a list of finite numbers", *it);
    Number n;
    n.d = item.get<double>();
    if (item.is_number_integer() &&
        !(item.is_number_unsigned() && item.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
      n.is_int = true;
      n.i = item.get<int64_t>();
    }
    out.push_back(n);
  }
  impl_->record(name, *it);
  return out;
}

std::vector<std::string> Config::get_strings(const std::string& name,
                                             const std::vector<std::string>& fallback) const {
  auto it = impl_->value.find(name);
  if (it == impl_->value.end()) {
    impl_->record(name, fallback);
    return fallback;
  }
  std::vector<std::string> out;
  if (!it->is_array()) wrong_type(impl_->what, name, "a list of strings", *it);
  for (const Json& item : *it) {
    if (!item.is_string()) wrong_type(impl_->what, name, "a list of strings", *it);
    out.push_back(item.get<std::string>());
  }
  impl_->record(name, *it);
  return out;
}

Config Config::get_object(const std::string& name, const std::string& what) const {
  auto it = impl_->value.find(name);
  auto child = std::make_unique<Impl>();
  child->what = what;
  child->echo = Json::object();
  if (it == impl_->value.end()) {
    child->value = Json::object();
  } else {
    if (!it->is_object()) wrong_type(impl_->what, name, "a JSON object", *it);
    child->value = *it;
  }
  impl_->read.insert(name);
  return Config(std::move(child));
}

void Config::check_known(const std::set<std::string>& known, const std::string& what) const {
  for (auto it = impl_->value.begin(); it != impl_->value.end(); ++it) {
    if (!known.count(it.key())) {
      std::string names;
      for (const auto& k : known) names += (names.empty() ? "" : ", ") + k;
      throw std::invalid_argument("unknown " + what + " parameter '" + it.key() +
                                  "' (known: " + names + ")");
    }
  }
}

void Config::set_echo(const std::string& name, const std::string& canonical_value) const {
  impl_->record(name, Json::parse(canonical_value));
}

void Config::drop_echo(const std::string& name) const { impl_->echo.erase(name); }

std::string Config::first_unread() const {
  for (auto it = impl_->value.begin(); it != impl_->value.end(); ++it)
    if (!impl_->read.count(it.key())) return it.key();
  return "";
}

std::string Config::echo() const {
  std::string out;
  write_canonical(impl_->echo, out);
  return out;
}

std::string canonical_json(double v) {
  std::string out;
  write_double(v, out);
  return out;
}

std::string canonical_json(const std::string& s) {
  std::string out;
  write_string(s, out);
  return out;
}

std::string canonical_json_text(const std::string& text) {
  std::string out;
  write_canonical(parse_strict(text, "JSON text"), out);
  return out;
}

bool same_json(const std::string& a, const std::string& b) {
  if (a == b) return true;
  try {
    return Json::parse(a) == Json::parse(b);
  } catch (const Json::exception&) {
    return false;
  }
}

bool same_optimizer_state(const std::string& a, const std::string& b) {
  if (a == b) return true;
  try {
    Json ja = Json::parse(a), jb = Json::parse(b);
    if (ja.is_object()) ja.erase("weight_decay");
    if (jb.is_object()) jb.erase("weight_decay");
    return ja == jb;
  } catch (const Json::exception&) {
    return false;
  }
}

std::string format_double(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return canonical_json(v);
}

}  // namespace dualemb
