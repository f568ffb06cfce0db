# Runs `kvq generate` and `kvq ppl --json` on stories260K as a user would (skipped when the shared data folder
# beside the repository is absent: ctest matches the message below).
set(models ${SOURCE_DIR}/../shared/data/models)
set(text ${SOURCE_DIR}/../shared/data/text/tinystories_val.txt)
if(NOT EXISTS ${models}/stories260K.bin OR NOT EXISTS ${models}/tok512.bin OR NOT EXISTS ${text})
  message("kvq test skipped: shared data absent")
  return()
endif()

execute_process(COMMAND ${KVQ} generate --model ${models}/stories260K.bin --tokenizer ${models}/tok512.bin
                        --prompt "Once upon a time" -n 40
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out MATCHES "^Once upon a time, there was a little girl named Lily"
   OR NOT err MATCHES "tokens/s")
  message(FATAL_ERROR "kvq generate (${rc}): stdout: ${out}\nstderr: ${err}")
endif()

execute_process(COMMAND ${KVQ} ppl --model ${models}/stories260K.bin --tokenizer ${models}/tok512.bin
                        --text ${text} --ctx 128 --max-tokens 256 --json
                OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvq ppl failed (${rc}): ${out}")
endif()
foreach(key ppl tokens mean_nll)
  string(JSON value ERROR_VARIABLE err GET "${out}" ${key})
  if(err)
    message(FATAL_ERROR "missing key ${key} in: ${out}")
  endif()
endforeach()
string(JSON tokens GET "${out}" tokens)
string(JSON ppl GET "${out}" ppl)
if(NOT tokens EQUAL 256 OR ppl LESS 2 OR ppl GREATER 8)
  message(FATAL_ERROR "kvq ppl: expected 256 tokens and a perplexity in [2, 8], got ${out}")
endif()

execute_process(COMMAND ${KVQ} generate --model ${models}/stories260K.bin -n 5
                ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "give a tokenizer file")
  message(FATAL_ERROR "a llama2.c model without --tokenizer must fail with a clear message, got rc=${rc}: ${err}")
endif()

# --score-from: positions 64..127 of each window of 128 (BOS at 0), two windows.
execute_process(COMMAND ${KVQ} ppl --model ${models}/stories260K.bin --tokenizer ${models}/tok512.bin --text ${text}
                        --ctx 128 --max-tokens 256 --score-from 64 --json
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvq ppl --score-from failed (${rc}): ${out}${err}")
endif()
string(JSON tokens GET "${out}" tokens)
if(NOT tokens EQUAL 128)
  message(FATAL_ERROR "kvq ppl --score-from 64: expected 128 scored tokens, got ${out}")
endif()

function(expect_model_error what)
  execute_process(COMMAND ${KVQ} ${ARGN} ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(rc EQUAL 0 OR NOT err MATCHES "${what}")
    message(FATAL_ERROR "kvq ${ARGN}: expected an error naming '${what}', got rc=${rc}: ${err}")
  endif()
endfunction()
set(stories --model ${models}/stories260K.bin --tokenizer ${models}/tok512.bin --text ${text})
expect_model_error("leaves nothing to score" ppl ${stories} --ctx 128 --max-tokens 256 --score-from 128)
# stories260K's heads (8 channels) are narrower than any codec holds: calibrate says so rather than crash.
expect_model_error("head dimension 8" calibrate ${stories} --budget-bits 4 --tokens 64 --ctx 64
                   --out ${CMAKE_CURRENT_BINARY_DIR}/stories.calib)
expect_model_error("int3" calibrate ${stories} --budget-bits 4 --tokens 64 --codecs f16,int3
                   --out ${CMAKE_CURRENT_BINARY_DIR}/stories.calib)
# A piece with '=' is an option of the candidate before it (so the odd reflector count reaches the int4 codec).
expect_model_error("int4,learn=3: learn=3 is not an even count" calibrate ${stories} --budget-bits 4 --tokens 64
                   --codecs f16,int4,learn=3 --out ${CMAKE_CURRENT_BINARY_DIR}/stories.calib)
expect_model_error("option 'learn=16' before any codec" calibrate ${stories} --budget-bits 4 --tokens 64
                   --codecs learn=16,int4 --out ${CMAKE_CURRENT_BINARY_DIR}/stories.calib)
expect_model_error("anchor codec int8 must be one of the candidates" calibrate ${stories} --budget-bits 4
                   --tokens 64 --codecs f16,int4 --anchor int8 --out ${CMAKE_CURRENT_BINARY_DIR}/stories.calib)
expect_model_error("must hold '{}'" calibrate ${stories} --budget-bits 3,4 --tokens 64
                   --out ${CMAKE_CURRENT_BINARY_DIR}/stories.calib)
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/damaged.calib "kvq-calibration 1\narchitecture llama\n")
expect_model_error("truncated" ppl ${stories} --max-tokens 64 --calib ${CMAKE_CURRENT_BINARY_DIR}/damaged.calib)
expect_model_error("not a regular file" ppl ${stories} --max-tokens 64 --calib ${CMAKE_CURRENT_BINARY_DIR}/absent.calib)
