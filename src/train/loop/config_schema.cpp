#include <lockstep/train/config_schema.h>

#include <algorithm>
#include <sstream>

namespace lockstep::train {
namespace {

[[noreturn]] void type_error(const std::string& key, const ConfigValue& v, const char* want) {
  throw ConfigError(v.where + "key '" + key + "' must be " + want + ", got " + v.type_name());
}

}  // namespace

std::string ConfigValue::type_name() const {
  switch (type) {
    case Type::Integer:
      return "an integer";
    case Type::Float:
      return "a float";
    case Type::Boolean:
      return "a boolean";
    case Type::String:
      return "a string";
    case Type::Table:
      return "a table";
    case Type::Array:
      return "an array";
    case Type::Other:
      return "a date/time";
  }
  return "?";
}

void ConfigSchema::declare(const std::string& key, Setter set) {
  const std::string section = key.substr(0, key.find('.'));
  if (std::find(section_order_.begin(), section_order_.end(), section) == section_order_.end())
    section_order_.push_back(section);
  fields_[key] = std::move(set);
}

void ConfigSchema::i64(const std::string& key, int64_t& dst, int64_t lo, int64_t hi) {
  declare(key, [key, &dst, lo, hi](const ConfigValue& v) {
    if (v.type != ConfigValue::Type::Integer) type_error(key, v, "an integer");
    if (v.integer < lo || v.integer > hi)
      throw ConfigError(v.where + "key '" + key + "' = " + std::to_string(v.integer) +
                        " is out of range [" + std::to_string(lo) + ", " +
                        (hi == INT64_MAX ? std::string("inf") : std::to_string(hi)) + "]");
    dst = v.integer;
  });
}

void ConfigSchema::f64(const std::string& key, double& dst, double lo, double hi) {
  declare(key, [key, &dst, lo, hi](const ConfigValue& v) {
    if (v.type != ConfigValue::Type::Integer && v.type != ConfigValue::Type::Float)
      type_error(key, v, "a number");
    if (v.number < lo || v.number > hi) {
      std::ostringstream os;
      os << v.where << "key '" << key << "' = " << v.number << " is out of range [" << lo << ", "
         << hi << "]";
      throw ConfigError(os.str());
    }
    dst = v.number;
  });
}

void ConfigSchema::boolean(const std::string& key, bool& dst) {
  declare(key, [key, &dst](const ConfigValue& v) {
    if (v.type != ConfigValue::Type::Boolean) type_error(key, v, "a boolean");
    dst = v.boolean;
  });
}

void ConfigSchema::str(const std::string& key, std::string& dst) {
  declare(key, [key, &dst](const ConfigValue& v) {
    if (v.type != ConfigValue::Type::String) type_error(key, v, "a string");
    dst = v.string;
  });
}

void ConfigSchema::one_of(const std::string& key, std::string& dst,
                          const std::vector<std::string>& allowed) {
  declare(key, [key, &dst, allowed](const ConfigValue& v) {
    if (v.type != ConfigValue::Type::String) type_error(key, v, "a string");
    std::string list;
    for (const auto& a : allowed) {
      if (a == v.string) {
        dst = v.string;
        return;
      }
      list += (list.empty() ? "" : ", ") + (a.empty() ? std::string("\"\"") : a);
    }
    throw ConfigError(v.where + "key '" + key + "' = '" + v.string + "' is not one of: " + list);
  });
}

void ConfigSchema::set(const std::string& key, const ConfigValue& value) const {
  auto it = fields_.find(key);
  if (it == fields_.end()) {
    const std::string section = key.substr(0, key.find('.'));
    throw ConfigError(value.where + "unknown key '" + key + "' (known keys in [" + section +
                      "]: " + known_in(section) + ")");
  }
  it->second(value);
}

bool ConfigSchema::has_section(const std::string& section) const {
  return std::find(section_order_.begin(), section_order_.end(), section) != section_order_.end();
}

std::string ConfigSchema::known_in(const std::string& section) const {
  std::string out;
  for (const auto& [k, f] : fields_)
    if (k.rfind(section + ".", 0) == 0)
      out += (out.empty() ? "" : ", ") + k.substr(section.size() + 1);
  return out;
}

std::string ConfigSchema::sections() const {
  std::string out;
  for (const auto& s : section_order_) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace lockstep::train
