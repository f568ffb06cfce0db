// The codec specs that tests, fuzz seeds and benchmarks sweep: every registered codec and bit width, one or more
// specs each (codec_contract_test checks that no registered codec is missing).
#pragma once

#include <string>
#include <vector>

namespace kvq::test {

inline std::vector<std::string> codec_test_specs() {
  return {
      "f32", "f16", "bf16",
      "int8", "int8:16", "int4", "int4:16",
      "kivi:2", "kivi:3", "kivi:4",
      "turbo_mse:1", "turbo_mse:2", "turbo_mse:3", "turbo_mse:4",
      "turbo_prod:2", "turbo_prod:3", "turbo_prod:4",
      // qjl with its default m = d rows decodes with relative error pi/2 - 1/d (it is an inner-product sketch, not a
      // reconstruction), above the contract's coarse 1.5; qjl:256 (0.39-0.78 at d = 64-128) keeps the contract and
      // turbo_codecs_test covers m = d.
      "qjl:256",
      "turbo_rvq:1", "turbo_rvq:2",
      "vecinfer:8/4", "vecinfer:10/8", "vecinfer:8/4,norm=1",
  };
}

}  // namespace kvq::test
