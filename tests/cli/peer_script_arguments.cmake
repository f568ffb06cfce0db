# bench/cpu/llama-cpp-peer.sh refuses absurd arguments before it downloads, builds or runs anything (exit 2, a
# message naming the value).
function(expect_refused pattern)
  execute_process(COMMAND bash ${SOURCE_DIR}/bench/cpu/llama-cpp-peer.sh ${ARGN}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 2 OR NOT "${out}${err}" MATCHES "${pattern}")
    message(FATAL_ERROR "llama-cpp-peer.sh ${ARGN}: expected exit 2 and '${pattern}', got rc=${rc}: ${out}${err}")
  endif()
endfunction()

expect_refused("'-1' is not a count" --threads -1)
expect_refused("'0' is not a count" --steps 0)
expect_refused("'99999' is not a count" --reps 99999)
expect_refused("--depth takes numbers" --depth 0,-5)
expect_refused("--depth takes numbers" --depth 4096x)
expect_refused("usage" --threads)
expect_refused("usage" --frobnicate 1)
