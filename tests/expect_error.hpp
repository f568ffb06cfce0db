// Expects a call to throw kvq::Error whose message contains a given text.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "kvq/error.hpp"

namespace kvq::test {

template <class Fn>
void expect_error(Fn&& fn, const std::string& text) {
  try {
    fn();
    ADD_FAILURE() << "expected an error mentioning '" << text << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

}  // namespace kvq::test
