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
