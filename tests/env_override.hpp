// An environment variable set for a scope, then restored (KVQ_ISA, KVQ_ATTENTION).
#pragma once

#include <cstdlib>
#include <string>

namespace kvq::test {

class EnvOverride {
 public:
  EnvOverride(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old, had_ = true;
    set(value);
  }
  ~EnvOverride() { set(had_ ? saved_.c_str() : nullptr); }
  EnvOverride(const EnvOverride&) = delete;
  EnvOverride& operator=(const EnvOverride&) = delete;

 private:
  void set(const char* value) const {
    if (value) {
      setenv(name_.c_str(), value, 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  std::string name_, saved_;
  bool had_ = false;
};

}  // namespace kvq::test
