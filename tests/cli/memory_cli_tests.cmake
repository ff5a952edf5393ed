# Memory preflight of `meshtrain train` (issue 36): a run that cannot fit is refused before
# anything is allocated (no data, model or optimizer yet), exit 2 on every rank with the
# predicted GiB by part, the available GiB, the rank and what would fit. The machine is made
# smaller with MESHTRAIN_MEMORY_AVAILABLE_GIB (the node's memory, divided among its ranks).
function(meshtrain_memory_test name gib)
  meshtrain_cli_test(${name} ${ARGN})
  set_property(TEST cli_${name} APPEND PROPERTY ENVIRONMENT MESHTRAIN_MEMORY_AVAILABLE_GIB=${gib})
endfunction()
set(_mem_out --train.out_dir ${CMAKE_BINARY_DIR}/cli_memory)
# A micro-batch too large for the node (the demo model, 512 x 128 tokens: ~2.5 GiB per rank).
meshtrain_memory_test(memory_micro_batch_1 1 1 2
  "rank 0 of 1: the run does not fit in memory: stage 0 of dp 1 x pp 1 x tp 1, ZeRO-0, mb 512 x 1, fp32, predicted [0-9.]+ GiB per rank \\(parameters [0-9.]+, gradients [0-9.]+, optimizer [0-9.]+, activations [0-9.]+ .* > available 1\\.00 GiB \\(MESHTRAIN_MEMORY_AVAILABLE_GIB 1\\.00 GiB / 1 rank\\(s\\) on the node\\)\\. What would fit with the same global batch: --train\\.micro_batch [0-9]+ --train\\.grad_accum [0-9]+ \\([0-9.]+ GiB per rank\\)"
  train --train.micro_batch 512 --train.seq_len 128 ${_mem_out})
meshtrain_memory_test(memory_micro_batch_4 1 4 2
  "rank 0 of 4: the run does not fit in memory: stage 0 of dp 4 x pp 1 x tp 1, ZeRO-0, mb 512 x 1, fp32, predicted [0-9.]+ GiB per rank .* > available 0\\.25 GiB \\(MESHTRAIN_MEMORY_AVAILABLE_GIB 1\\.00 GiB / 4 rank\\(s\\) on the node\\)\\. What would fit with the same global batch: --train\\.micro_batch [0-9]+ --train\\.grad_accum [0-9]+"
  train --train.micro_batch 512 --train.seq_len 128 ${_mem_out})
# Context parallelism: the layout predicted is the run's (each rank holds seq_len / cp rows).
meshtrain_memory_test(memory_cp_2 1 2 2
  "rank 0 of 2: the run does not fit in memory: stage 0 of dp 1 x cp 2 x pp 1 x tp 1, ZeRO-0, mb 512 x 1, fp32, predicted [0-9.]+ GiB per rank .* > available 0\\.50 GiB"
  train --mesh.cp 2 --train.micro_batch 512 --train.seq_len 128 ${_mem_out})
# A model too large for the node: GPT-2 1.5B in fp32 (~6 GiB of parameters alone).
meshtrain_memory_test(memory_model_1 16 1 2
  "rank 0 of 1: the run does not fit in memory: .*predicted [0-9.]+ GiB per rank \\(parameters 5\\.80, gradients 5\\.80, optimizer 11\\.61, .*checkpoint staging 17\\.41 GiB\\) > available 16\\.00 GiB.*nothing that 1 rank\\(s\\) can run fits: the smallest, --train\\.micro_batch 1 .*needs [0-9.]+ GiB per rank"
  train --model.preset gpt2-1.5b --train.seq_len 1024 ${_mem_out})
meshtrain_memory_test(memory_model_4 16 4 2
  "rank 0 of 4: the run does not fit in memory: stage 0 of dp 4 x pp 1 x tp 1, ZeRO-0, .*parameters 5\\.80, .* > available 4\\.00 GiB .*What would fit with the same global batch: nothing that 4 rank\\(s\\) can run fits"
  train --model.preset gpt2-1.5b --train.seq_len 1024 ${_mem_out})
# With 12 GiB per rank the same model fits 4 ranks at ZeRO-3: suggested.
meshtrain_memory_test(memory_model_4_zero 48 4 2
  "> available 12\\.00 GiB .*What would fit with the same global batch: --zero\\.stage 3 \\([0-9.]+ GiB per rank\\)"
  train --model.preset gpt2-1.5b --train.seq_len 1024 --train.micro_batch 1 --train.recompute
  ${_mem_out})
# warn starts anyway (its warning is on stderr, after stdout's progress lines in the output the
# test sees), off does not look.
meshtrain_memory_test(memory_warn 0.001 2 0
  "step +3/3.*warning: train.memory_check: rank 0 of 2: the run does not fit in memory"
  train ${_train_small} --train.memory_check warn --train.sample_tokens 0 --train.save false
  --train.out_dir ${CMAKE_BINARY_DIR}/cli_memory_warn)
meshtrain_memory_test(memory_off 0.001 1 0 "step +3/3" train ${_train_small}
  --train.memory_check off --train.sample_tokens 0 --train.save false
  --train.out_dir ${CMAKE_BINARY_DIR}/cli_memory_off)
set_tests_properties(cli_memory_warn cli_memory_off PROPERTIES FIXTURES_REQUIRED kjv_shards)
meshtrain_cli_test(memory_bad_mode 1 2 "train.memory_check='maybe' is not one of error, warn, off"
  train --train.memory_check maybe ${_mem_out})
meshtrain_memory_test(memory_bad_env abc 1 2
  "MESHTRAIN_MEMORY_AVAILABLE_GIB='abc' is not a positive number of GiB" train ${_mem_out})
