#pragma once
// A string built in constant expressions and kept in a constexpr variable: the
// text of explain(), computed by the compiler.
#include <cstddef>
#include <string>
#include <string_view>

namespace dtensor {

template <std::size_t N>
struct FixedString {
  char buf[N + 1]{};
  std::size_t len = 0;

  constexpr FixedString& operator+=(std::string_view s) {
    for (char c : s)
      if (len < N) buf[len++] = c;
    buf[len] = '\0';
    return *this;
  }
  constexpr FixedString& operator+=(long long v) {
    if (v < 0) *this += "-", v = -v;
    char tmp[24]{};
    int n = 0;
    do tmp[n++] = static_cast<char>('0' + v % 10), v /= 10;
    while (v);
    while (n) *this += std::string_view(&tmp[--n], 1);
    return *this;
  }
  constexpr FixedString& pad_to(std::size_t col) {
    std::size_t line = len;
    while (line > 0 && buf[line - 1] != '\n') --line;
    while (len - line < col) *this += " ";
    return *this;
  }
  constexpr std::string_view view() const { return {buf, len}; }
  constexpr const char* c_str() const { return buf; }
  operator std::string_view() const { return view(); }
  std::string str() const { return std::string(view()); }
};

}  // namespace dtensor
