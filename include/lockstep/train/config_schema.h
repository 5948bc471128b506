// lockstep/train/config_schema.h: the strict schema of a trainer configuration.
//
// A schema is a flat table "section.key" -> typed setter bound to a struct field, so the
// set of known keys, their types and the fields cannot drift apart. The trainer declares
// its generic sections ([run], [optim], [schedule], [train], [strategy], [eval] gate,
// [checkpoint], [log]); a workload declares its own (train::Workload::declare_config),
// possibly adding keys to a shared section such as [eval]. Every key is checked by the
// same code, so a workload's errors read exactly like the trainer's:
//   FILE:LINE:COLUMN: key 'data.items' must be an integer, got a string
// Not thread-safe; the bound fields must outlive the schema's use.
#pragma once

#include <lockstep/error.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace lockstep::train {

// One configuration value as the parser read it, with where it came from.
struct ConfigValue {
  enum class Type { Integer, Float, Boolean, String, Table, Array, Other };
  Type type = Type::Other;
  int64_t integer = 0;
  double number = 0;  // set for Integer and Float
  bool boolean = false;
  std::string string;
  std::string where;  // "FILE:LINE:COLUMN: " or "--set KEY=VALUE: "

  // "an integer", "a float", "a string", ... (for error messages).
  std::string type_name() const;
};

class ConfigSchema {
 public:
  // Key declarations: "section.key" bound to `dst`. Integers accept only integers;
  // numbers accept integers and floats; ranges are inclusive.
  void i64(const std::string& key, int64_t& dst, int64_t lo, int64_t hi = INT64_MAX);
  void f64(const std::string& key, double& dst, double lo, double hi = 1e300);
  void boolean(const std::string& key, bool& dst);
  void str(const std::string& key, std::string& dst);
  void one_of(const std::string& key, std::string& dst, const std::vector<std::string>& allowed);

  // Checks `value` against the key's declaration and stores it; throws ConfigError
  // (prefixed with value.where) for an unknown key, a wrong type or a bad value.
  void set(const std::string& key, const ConfigValue& value) const;

  bool has_key(const std::string& key) const { return fields_.count(key) != 0; }
  bool has_section(const std::string& section) const;
  // The known keys of `section`, comma separated, in sorted order.
  std::string known_in(const std::string& section) const;
  // Every section, in the order of their first declared key, comma separated.
  std::string sections() const;

 private:
  using Setter = std::function<void(const ConfigValue&)>;
  void declare(const std::string& key, Setter set);

  std::map<std::string, Setter> fields_;
  std::vector<std::string> section_order_;
};

}  // namespace lockstep::train
