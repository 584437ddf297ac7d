// Environment variables for one test: set or unset them, and the old values come back when the
// test ends (in reverse order). `after_change` runs after every change and after the restore,
// for code that reads the environment once and must be told to read it again (for example
// cudnn::ReloadSettings).
#pragma once

#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fusedattn::testing {

class ScopedEnv {
 public:
  explicit ScopedEnv(std::function<void()> after_change = nullptr)
      : after_change_(std::move(after_change)) {}
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

  // value nullptr unsets the variable.
  void set(const char* name, const char* value) {
    const char* old = std::getenv(name);
    saved_.emplace_back(name, old != nullptr ? std::optional<std::string>(old) : std::nullopt);
    if (value != nullptr)
      setenv(name, value, 1);
    else
      unsetenv(name);
    if (after_change_) after_change_();
  }

  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second)
        setenv(it->first.c_str(), it->second->c_str(), 1);
      else
        unsetenv(it->first.c_str());
    }
    if (after_change_) after_change_();
  }

 private:
  std::function<void()> after_change_;
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

}  // namespace fusedattn::testing
