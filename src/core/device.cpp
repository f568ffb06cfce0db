#include "kvq/device.hpp"

#include <charconv>

#include "kvq/error.hpp"

namespace kvq {

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  constexpr std::string_view prefix = "cuda:";
  if (text.size() > prefix.size() && text.substr(0, prefix.size()) == prefix) {
    const std::string_view number = text.substr(prefix.size());
    int index = -1;
    const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), index);
    if (ec == std::errc{} && end == number.data() + number.size() && index >= 0) return cuda(index);
  }
  throw Error("device '" + std::string(text) + "': expected \"cpu\", \"cuda\" or \"cuda:N\"");
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

}  // namespace kvq
