# Behaviour of the meshtrain executable. meshtrain_cli_test(name ranks rc regex args...)
# ranks 0 = run without a launcher.
function(meshtrain_cli_test name ranks rc regex)
  if(ranks EQUAL 0)
    set(cmd $<TARGET_FILE:meshtrain> ${ARGN})
    set(procs 1)
  else()
    set(cmd ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${MPIEXEC_PREFLAGS}
            $<TARGET_FILE:meshtrain> ${MPIEXEC_POSTFLAGS} ${ARGN})
    set(procs ${ranks})
  endif()
  # ctest would split a ;-list into separate arguments: join with a separator expect.cmake undoes.
  string(REPLACE ";" "@@" cmd_escaped "${cmd}")
  add_test(NAME cli_${name}
    COMMAND ${CMAKE_COMMAND} "-DCMD=${cmd_escaped}" -DEXPECT_RC=${rc} "-DEXPECT_OUT=${regex}"
            -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/expect.cmake
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(cli_${name} PROPERTIES PROCESSORS ${procs} TIMEOUT 180 LABELS cli
    ENVIRONMENT "${MESHTRAIN_TEST_MPI_ENV}")
endfunction()

meshtrain_cli_test(help 0 0 "selfcheck" --help)
meshtrain_cli_test(no_args 0 2 "usage: meshtrain")
meshtrain_cli_test(version 0 0 "meshtrain [0-9]+\\.[0-9]+\\.[0-9]+ \\(Kokkos" --version)
meshtrain_cli_test(unknown_subcommand 0 2 "unknown subcommand 'trian'" trian)
meshtrain_cli_test(selfcheck_help 0 0 "mesh\\.tp" selfcheck --help)
meshtrain_cli_test(selfcheck_4 4 0 "selfcheck passed" selfcheck --mesh.tp 2)
meshtrain_cli_test(selfcheck_8_3d 8 0 "selfcheck passed" selfcheck
  --mesh.tp 2 --mesh.pp 2 --mesh.dp 2 --selfcheck.counts 0,5,1001)
meshtrain_cli_test(selfcheck_all_ranks 2 0 "\\[rank 1 0/0/1\\]" selfcheck --mesh.tp 2
  --log.all_ranks --selfcheck.counts 3)
meshtrain_cli_test(bad_world 4 2 "mesh.dp x mesh.pp x mesh.tp = 3 x 1 x 1 = 3 but the job has 4 ranks"
  selfcheck --mesh.dp 3)
meshtrain_cli_test(bad_zero_size 2 2 "mesh.tp=0 must be a positive integer" selfcheck --mesh.tp 0)
meshtrain_cli_test(bad_negative 2 2 "mesh.pp=-1 must be a positive integer" selfcheck --mesh.pp -1)
meshtrain_cli_test(bad_order 2 2 "mesh.order='tp-xp-pp'" selfcheck --mesh.order tp-xp-pp)
meshtrain_cli_test(bad_key_in_file 2 2 "unknown key 'mesh.tpp' in .*bad_key.ini"
  selfcheck --config tests/cli/bad_key.ini)
meshtrain_cli_test(bad_value_in_file 2 2 "mesh.tp.*bad_value.ini"
  selfcheck --config tests/cli/bad_value.ini)
meshtrain_cli_test(missing_config 2 2 "config file 'nope.ini' \\(--config\\) cannot be opened"
  selfcheck --config nope.ini)

# meshtrain prep: text -> token shards, rank 0 only; runs with or without a launcher.
meshtrain_cli_test(prep_help 0 0 "prep\\.shard_tokens" prep --help)
meshtrain_cli_test(prep_kjv 0 0 "train 1203090 tokens in 1 shard\\(s\\).*val 63321 tokens" prep
  --prep.input inputs/kjv.txt --prep.output ${CMAKE_BINARY_DIR}/cli_prep/kjv --prep.tokenizer byte)
meshtrain_cli_test(prep_2_ranks 2 0 "train 1203090 tokens in 3 shard" prep
  --prep.input inputs/kjv.txt --prep.output ${CMAKE_BINARY_DIR}/cli_prep/kjv2
  --prep.shard_tokens 500000)
meshtrain_cli_test(prep_missing_input 0 2 "prep.input: cannot open 'no_such_text.txt'" prep
  --prep.input no_such_text.txt --prep.output ${CMAKE_BINARY_DIR}/cli_prep/none)
meshtrain_cli_test(prep_missing_input_2_ranks 2 2 "prep.input: cannot open 'no_such_text.txt'" prep
  --prep.input no_such_text.txt --prep.output ${CMAKE_BINARY_DIR}/cli_prep/none)
meshtrain_cli_test(prep_missing_input_in_file 0 2 "cannot open 'missing_from_ini.txt'" prep
  --config tests/cli/prep_missing.ini)
meshtrain_cli_test(prep_vocab_too_big 0 2 "70001 ids but token shards store uint16" prep
  --prep.input inputs/kjv.txt --prep.output ${CMAKE_BINARY_DIR}/cli_prep/big --prep.tokenizer gpt2
  --prep.vocab_json tests/io/data/big_vocab.json --prep.merges_txt tests/io/data/tiny_merges.txt)
meshtrain_cli_test(prep_no_output 0 2 "prep.output is required" prep --prep.input inputs/kjv.txt)
set_tests_properties(cli_prep_kjv PROPERTIES FIXTURES_SETUP kjv_shards)
# JSON lines over 2 ranks: the cut-off line 3 of tests/cli/corpus.jsonl is skipped and listed,
# or stops the job under prep.strict.
meshtrain_cli_test(prep_jsonl 2 0 "train [0-9]+ tokens.*skipped 1 of 24 JSON lines \\(1 not JSON.*corpus.jsonl:3: not JSON"
  prep --prep.input tests/cli/corpus.jsonl --prep.output ${CMAKE_BINARY_DIR}/cli_prep/corpus
  --prep.doc_index)
set_tests_properties(cli_prep_jsonl PROPERTIES FIXTURES_SETUP jsonl_shards)
meshtrain_cli_test(prep_jsonl_strict 2 2 "prep.strict: tests/cli/corpus.jsonl:3: not JSON \\(unterminated string"
  prep --prep.input tests/cli/corpus.jsonl --prep.output ${CMAKE_BINARY_DIR}/cli_prep/strict
  --prep.strict)

# meshtrain train / generate on the shipped corpus (a 1-layer model, a few steps).
set(_train_base --model.n_embd 32 --train.micro_batch 2
    --train.seq_len 32 --train.steps 3 --train.warmup 1 --train.eval_batches 1
    --data.train ${CMAKE_BINARY_DIR}/cli_prep/kjv_train_*.bin
    --data.val ${CMAKE_BINARY_DIR}/cli_prep/kjv_val_*.bin)
set(_train_small ${_train_base} --model.n_layer 1 --model.n_head 2)
meshtrain_cli_test(train_smoke 1 0 "step +3/3 \\| loss [0-9.]+ .*final val loss.*sample:" train
  ${_train_small} --train.sample_tokens 20 --train.out_dir ${CMAKE_BINARY_DIR}/cli_train)
set_tests_properties(cli_train_smoke PROPERTIES FIXTURES_REQUIRED kjv_shards
  FIXTURES_SETUP trained_model)
meshtrain_cli_test(generate_smoke 0 0 "^And God said" generate
  --generate.model ${CMAKE_BINARY_DIR}/cli_train/model --generate.tokens 30)
set_tests_properties(cli_generate_smoke PROPERTIES FIXTURES_REQUIRED trained_model)
# A blend of the shipped corpus and the JSON-lines one: tokens and validation loss per source,
# and a line when the small source starts its second epoch.
meshtrain_cli_test(train_blend 2 0 "source '[^']*cli_prep/corpus' \\(data.blend\\) completed epoch 1 at step.*final val loss [0-9.]+ \\(.*cli_prep/kjv [0-9.]+, .*cli_prep/corpus [0-9.]+\\)"
  train --model.n_embd 32 --model.n_layer 1 --model.n_head 2 --train.micro_batch 8
  --train.seq_len 32 --train.steps 4 --train.warmup 1 --train.eval_batches 1
  --data.blend "0.1 ${CMAKE_BINARY_DIR}/cli_prep/kjv 0.9 ${CMAKE_BINARY_DIR}/cli_prep/corpus"
  --train.sample_tokens 0 --train.save false --train.out_dir ${CMAKE_BINARY_DIR}/cli_train_blend)
set_tests_properties(cli_train_blend PROPERTIES FIXTURES_REQUIRED "kjv_shards;jsonl_shards")
meshtrain_cli_test(train_blend_and_train 1 2 "data.train and data.blend are both given" train
  ${_train_small} --data.blend "1 ${CMAKE_BINARY_DIR}/cli_prep/kjv"
  --train.out_dir ${CMAKE_BINARY_DIR}/cli_train_blend2)
set_tests_properties(cli_train_blend_and_train PROPERTIES FIXTURES_REQUIRED kjv_shards)
meshtrain_cli_test(train_recompute 1 0 "final val loss" train ${_train_small}
  --train.recompute --train.sample_tokens 0 --train.save false
  --train.out_dir ${CMAKE_BINARY_DIR}/cli_train_recompute)
set_tests_properties(cli_train_recompute PROPERTIES FIXTURES_REQUIRED kjv_shards)
# The Llama demo config (inputs/llama-demo.ini) for a few steps under tp 2 (kv heads split),
# sampled on rank 0; the block description's options and what is not implemented for Llama.
meshtrain_cli_test(train_llama_demo 2 0 "llama-tiny: .*llama block.*step +3/3 \\| loss .*sample:"
  train --config inputs/llama-demo.ini --mesh.tp 2 --train.steps 3 --train.warmup 1
  --train.eval_batches 1 --train.eval_every 3 --train.sample_tokens 20 --train.micro_batch 2
  --train.seq_len 32 --data.train ${CMAKE_BINARY_DIR}/cli_prep/kjv_train_*.bin
  --data.val ${CMAKE_BINARY_DIR}/cli_prep/kjv_val_*.bin
  --train.out_dir ${CMAKE_BINARY_DIR}/cli_llama_demo)
set_tests_properties(cli_train_llama_demo PROPERTIES FIXTURES_REQUIRED kjv_shards)
meshtrain_cli_test(train_llama_overrides 1 0 "8 heads \\(1 key-value\\).*llama block \\(rmsnorm, rotary, swiglu 96, tied head\\).*final val loss"
  train ${_train_base} --model.preset llama-tiny --model.n_layer 1 --model.n_head 8
  --model.n_kv_head 1 --model.head_dim 8 --model.intermediate_size 96 --model.tied_head true
  --model.rope_theta 5e5 --model.rope_scaling llama3 --model.rope_original_max_position 16
  --train.sample_tokens 0 --train.save false --train.out_dir ${CMAKE_BINARY_DIR}/cli_llama_over)
set_tests_properties(cli_train_llama_overrides PROPERTIES FIXTURES_REQUIRED kjv_shards)
meshtrain_cli_test(train_llama_save 1 0 "saved .*cli_llama_save/model \\(HuggingFace LlamaForCausalLM, BF16\\)"
  train ${_train_base} --model.preset llama-tiny --train.save_dtype bf16 --train.sample_tokens 0
  --train.out_dir ${CMAKE_BINARY_DIR}/cli_llama_save)
# Qwen2's q/k/v biases: trained under tp 2 (kv heads split) and exported as Qwen2ForCausalLM.
meshtrain_cli_test(train_qwen2_save 2 0 "q/k/v biases.*saved .*cli_qwen2_save/model \\(HuggingFace Qwen2ForCausalLM, F32\\)"
  train ${_train_base} --model.preset llama-tiny --model.qkv_bias true --mesh.tp 2
  --train.sample_tokens 0 --train.out_dir ${CMAKE_BINARY_DIR}/cli_qwen2_save)
set_tests_properties(cli_train_qwen2_save PROPERTIES FIXTURES_REQUIRED kjv_shards)
meshtrain_cli_test(train_sliding_window 1 2 "model.sliding_window=16 \\(Mistral's attention window\\) is shorter than train.seq_len=32"
  train ${_train_base} --model.preset llama-tiny --model.sliding_window 16
  --train.out_dir ${CMAKE_BINARY_DIR}/cli_window)
set_tests_properties(cli_train_sliding_window PROPERTIES FIXTURES_REQUIRED kjv_shards)
meshtrain_cli_test(train_bad_block 0 2 "model.norm='batchnorm' is not one of layernorm, rmsnorm"
  train --model.norm batchnorm)
meshtrain_cli_test(train_gpt2_gqa 0 2 "model.family=gpt2 has n_head key-value heads" train
  --model.n_kv_head 2 ${_train_base})
meshtrain_cli_test(train_hf_unsupported 0 2 "hf_gemma_folder/config.json: model_type 'gemma' is not supported"
  train --model.init_from ${PROJECT_SOURCE_DIR}/tests/io/data/hf_gemma_folder)
meshtrain_cli_test(train_hf_llama_no_weights 2 2 "model.init_from .*hf_llama_no_weights' has neither model.safetensors.index.json nor model.safetensors"
  train --model.init_from ${PROJECT_SOURCE_DIR}/tests/io/data/hf_llama_no_weights --train.save false
  --train.seq_len 16 --train.steps 1 --mesh.tp 2 --data.train ${CMAKE_BINARY_DIR}/cli_prep/kjv_train_*.bin
  --data.val ${CMAKE_BINARY_DIR}/cli_prep/kjv_val_*.bin --train.out_dir ${CMAKE_BINARY_DIR}/cli_hf_llama)
set_tests_properties(cli_train_hf_llama_no_weights PROPERTIES FIXTURES_REQUIRED kjv_shards)
# Parallel layouts: a 3D run end to end (export and sample gathered on rank 0) and the
# configuration checks, which must fail on every rank with one message instead of hanging.
meshtrain_cli_test(train_3d 8 0
  "layout: dp 2 \\(ZeRO-1\\) x pp 2 .*x tp 2.*step +3/3 .*final val loss.*saved .*sample:" train
  ${_train_base} --model.n_layer 2 --model.n_head 2 --mesh.pp 2 --mesh.tp 2 --zero.stage 1 --train.grad_accum 2
  --tp.sequence_parallel --train.sample_tokens 10 --train.out_dir ${CMAKE_BINARY_DIR}/cli_train_3d)
set_tests_properties(cli_train_3d PROPERTIES FIXTURES_REQUIRED kjv_shards)
meshtrain_cli_test(train_tp_heads 2 2 "mesh.tp=2 must divide model.n_head=1" train ${_train_base}
  --model.n_layer 1 --model.n_head 1 --mesh.tp 2 --train.out_dir ${CMAKE_BINARY_DIR}/cli_train_bad)
meshtrain_cli_test(train_pp_layers 2 2 "2 pipeline stages but model.n_layer=1" train
  ${_train_small} --mesh.pp 2 --train.out_dir ${CMAKE_BINARY_DIR}/cli_train_bad)
meshtrain_cli_test(train_bad_zero 2 2 "zero.stage=5 must be 0, 1, 2 or 3" train ${_train_small}
  --zero.stage 5 --train.out_dir ${CMAKE_BINARY_DIR}/cli_train_bad)
meshtrain_cli_test(train_bad_schedule 2 2 "pp.schedule" train ${_train_base} --mesh.pp 2
  --model.n_layer 2 --model.n_head 2 --pp.schedule zigzag --train.out_dir ${CMAKE_BINARY_DIR}/cli_train_bad)
set_tests_properties(cli_train_tp_heads cli_train_pp_layers cli_train_bad_zero
  cli_train_bad_schedule PROPERTIES FIXTURES_REQUIRED kjv_shards)
meshtrain_cli_test(train_missing_data 1 2 "no_such_\\*\\.bin" train
  --data.train no_such_*.bin --train.out_dir ${CMAKE_BINARY_DIR}/cli_train_missing)
meshtrain_cli_test(train_bad_preset 1 2 "model.preset='gpt3' is not one of" train
  --model.preset gpt3)
meshtrain_cli_test(train_seq_too_long 1 2 "train.seq_len=4096 must be in \\[1, model.block_size=128\\]"
  train --train.seq_len 4096 --data.train ${CMAKE_BINARY_DIR}/cli_prep/kjv_train_*.bin
  --data.val ${CMAKE_BINARY_DIR}/cli_prep/kjv_val_*.bin --train.out_dir ${CMAKE_BINARY_DIR}/cli_train_bad)
set_tests_properties(cli_train_seq_too_long PROPERTIES FIXTURES_REQUIRED kjv_shards)
if(NOT MESHTRAIN_ENABLE_CUDA)
  meshtrain_cli_test(train_bf16_on_cpu 1 2 "train.precision=bf16 needs a GPU build" train
    --train.precision bf16)
  meshtrain_cli_test(train_cudnn_on_cpu 1 2 "attn.impl=cudnn: cuDNN attention needs the CUDA build"
    train --attn.impl cudnn)
endif()
meshtrain_cli_test(train_bad_attn_impl 1 2 "attn.impl='flash' is not one of auto, cudnn, meshtrain"
  train --attn.impl flash)
meshtrain_cli_test(train_bad_precision 1 2 "train.precision='fp9' is not one of fp32, bf16, fp16, fp8"
  train --train.precision fp9)
# Issue 35: train.precision=fp8 (on the CPU build, the FP8 GEMMs' exact emulation) at tp 2 with
# sequence parallelism, rowwise, the weight gradients in bf16; and the fp8.* options' errors.
meshtrain_cli_test(train_fp8 2 0
  "fp8: the linears of blocks \\[0, 2\\) in FP8 \\(rowwise current scaling.*weight gradients in bf16.*emulation.*step +3/3 \\| loss [0-9.]+ .*\\| FP8 [0-9]+% of FLOPs.*final val loss"
  train ${_train_base} --model.n_layer 2 --model.n_head 2 --mesh.tp 2 --tp.sequence_parallel
  --train.precision fp8 --fp8.recipe rowwise --fp8.wgrad_bf16
  --train.out_dir ${CMAKE_BINARY_DIR}/cli_train_fp8)
set_tests_properties(cli_train_fp8 PROPERTIES FIXTURES_REQUIRED kjv_shards)
meshtrain_cli_test(train_fp8_option_without_fp8 1 2
  "fp8.wgrad_bf16 needs train.precision=fp8 \\(it is fp32\\)" train --fp8.wgrad_bf16)
meshtrain_cli_test(train_fp8_bad_recipe 1 2
  "fp8.recipe='blockwise' is not one of tensorwise, rowwise" train --train.precision fp8
  --fp8.recipe blockwise)
meshtrain_cli_test(train_fp8_all_bf16 1 2
  "fp8.first_last_bf16=1 keeps all model.n_layer=2 blocks in bf16: no linear would run in FP8"
  train --train.precision fp8 --model.n_layer 2 --fp8.first_last_bf16 1)
meshtrain_cli_test(train_help_fp8 0 0 "fp8.recipe.*tensorwise.*rowwise.*fp8.first_last_bf16.*fp8.wgrad_bf16.*fp8.experts"
  train --help)
# fp8.experts: a MoE model's experts in FP8 too (rowwise), at ep 2; the log says so and the FP8
# share of FLOPs counts them.
meshtrain_cli_test(train_fp8_moe_experts 2 0
  "fp8: the linears of blocks \\[0, 2\\) in FP8 \\(tensorwise current scaling.*MoE experts in FP8 \\(rowwise\\)\\); embedding, LM head, attention, norms, MoE routers in.*step +3/3 \\| loss [0-9.]+ .*\\| FP8 [0-9]+% of FLOPs"
  train ${_train_base} --model.n_layer 2 --model.n_head 2 --moe.experts 4 --mesh.ep 2
  --train.precision fp8 --fp8.experts --train.save false
  --train.out_dir ${CMAKE_BINARY_DIR}/cli_train_fp8_moe)
set_tests_properties(cli_train_fp8_moe_experts PROPERTIES FIXTURES_REQUIRED kjv_shards)
meshtrain_cli_test(train_fp8_experts_without_fp8 1 2
  "fp8.experts needs train.precision=fp8 \\(it is fp32\\)" train --fp8.experts)

# Checkpoints and restarts (issue 8): a crash during a save, SIGUSR1 from a rank and from
# outside, corrupt/truncated/mismatched checkpoints, convert -> generate. Each case runs the
# 2-rank job several times through tests/cli/test_resume.sh; the launcher line is the one above.
set(_resume_launch ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MPIEXEC_PREFLAGS}
    $<TARGET_FILE:meshtrain>)
foreach(case crash signal kill errors convert convert_llama convert_mixtral async_kill
        async_signal async_full_disk async_fallback)
  add_test(NAME cli_resume_${case}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_resume.sh ${case}
            ${CMAKE_BINARY_DIR}/cli_resume/${case} ${CMAKE_BINARY_DIR}/cli_prep/kjv_train_*.bin
            -- ${_resume_launch})
  set_tests_properties(cli_resume_${case} PROPERTIES PROCESSORS 2 TIMEOUT 300 LABELS cli
    FIXTURES_REQUIRED kjv_shards ENVIRONMENT "${MESHTRAIN_TEST_MPI_ENV}")
endforeach()
meshtrain_cli_test(convert_help 0 0 "convert\\.checkpoint" convert --help)
meshtrain_cli_test(train_help_ckpt 0 0 "train\\.resume.*ckpt\\.dir.*ckpt\\.every" train --help)
meshtrain_cli_test(usage_exit_3 0 0 "3 `train` saved a checkpoint after SIGUSR1/SIGTERM" --help)
meshtrain_cli_test(convert_no_checkpoint 0 2 "no checkpoint to resume from" convert
  --convert.dir ${CMAKE_BINARY_DIR}/cli_resume/none
  --convert.out ${CMAKE_BINARY_DIR}/cli_resume/none_hf)
meshtrain_cli_test(convert_no_checkpoint_2_ranks 2 2 "no checkpoint to resume from" convert
  --convert.dir ${CMAKE_BINARY_DIR}/cli_resume/none
  --convert.out ${CMAKE_BINARY_DIR}/cli_resume/none_hf)
meshtrain_cli_test(train_bad_ckpt_io 1 2
  "ckpt.io='fast' is not one of automatic, collective, independent" train --ckpt.io fast
  --train.out_dir ${CMAKE_BINARY_DIR}/cli_resume/bad_io)
# The planner and its calibration benchmark.
include(${CMAKE_CURRENT_SOURCE_DIR}/cli/plan_cli_tests.cmake)
# The memory preflight of train.
include(${CMAKE_CURRENT_SOURCE_DIR}/cli/memory_cli_tests.cmake)

# Fail loudly, never hang, lose nothing (issue 17): each failure at 2-4 ranks through
# tests/cli/test_failures.sh, which bounds the run, checks that no rank is left, the exit code
# and the message (and the checkpoints, flight dumps and metrics where the case says so).
set(_fail_launch ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${MPIEXEC_PREFLAGS} --
    $<TARGET_FILE:meshtrain>)
foreach(case shard_one_rank metrics_no_folder out_dir_one_rank ckpt_unwritable one_rank_throws
        diverge_stop diverge_scaling nan_stop nan_skip nan_rollback watchdog_stall watchdog_skip
        watchdog_abort_hangs metrics_4_ranks metrics_full_disk ckpt_full_disk ckpt_metadata local_sigterm
        local_sigint_twice slurm_mpirun_sigterm)
  add_test(NAME cli_fail_${case}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_failures.sh ${case}
            ${CMAKE_BINARY_DIR}/cli_fail/${case} ${CMAKE_BINARY_DIR}/cli_prep/kjv_train_*.bin
            -- ${_fail_launch})
  set(_procs 2)
  if(case STREQUAL metrics_4_ranks)
    set(_procs 4)
  endif()
  set_tests_properties(cli_fail_${case} PROPERTIES PROCESSORS ${_procs} TIMEOUT 300 LABELS cli
    FIXTURES_REQUIRED kjv_shards ENVIRONMENT "${MESHTRAIN_TEST_MPI_ENV}")
endforeach()
# Range checks and option spelling: one message naming the option, exit 2, on every rank.
# (Checked right after parsing: no data or model needed.)
set(_range_base train --train.out_dir ${CMAKE_BINARY_DIR}/cli_train_bad)
meshtrain_cli_test(range_lr 2 2 "train.lr=-0.1 must be >= 0" ${_range_base} --train.lr -0.1)
meshtrain_cli_test(range_beta 2 2 "train.beta2=1 must be in \\[0, 1\\)" ${_range_base}
  --train.beta2 1)
meshtrain_cli_test(range_eps 2 2 "train.eps=0 must be > 0" ${_range_base} --train.eps 0)
meshtrain_cli_test(range_warmup 2 2 "train.warmup=-5 must be >= 0" ${_range_base}
  --train.warmup -5)
meshtrain_cli_test(range_clip 2 2 "train.grad_clip=-1 must be >= 0" ${_range_base}
  --train.grad_clip -1)
meshtrain_cli_test(range_decay 2 2 "train.weight_decay=-0.1 must be >= 0" ${_range_base}
  --train.weight_decay -0.1)
meshtrain_cli_test(range_eval_batches 2 2 "train.eval_batches=0 must be >= 1" ${_range_base}
  --train.eval_batches 0)
meshtrain_cli_test(range_on_nonfinite 2 2 "train.on_nonfinite='retry' is not one of stop, skip, rollback"
  ${_range_base} --train.on_nonfinite retry)
meshtrain_cli_test(range_timeout 2 2 "comm.timeout=-1 must be >= 0" ${_range_base}
  --comm.timeout -1)
meshtrain_cli_test(option_prefix 2 2
  "unknown option '--train.step' \\(command line; did you mean --train.steps\\?" ${_range_base}
  --train.step 3)
meshtrain_cli_test(option_prefix_ini 0 2 "unknown key 'train.step' in .*prefix.ini \\(did you mean train.steps\\?"
  train --config tests/cli/prefix.ini)
# The planner answers in bounded time whatever the global batch (a token count typed as a
# sequence count), and checks its options.
meshtrain_cli_test(plan_huge_batch 0 0 "not evaluated: [0-9]+ .*more than 1024 micro-batches"
  plan ${_plan_model} --plan.world 8 --plan.gpus_per_node 8 --plan.calibration inputs/plan/cpu.json
  --plan.global_batch 1048576)
meshtrain_cli_test(plan_range_top 0 2 "plan.top=0 must be >= 1" plan --plan.top 0)
meshtrain_cli_test(plan_range_batch 0 2 "plan.global_batch=-4 must be in \\[0, 16777216\\]" plan
  --plan.global_batch -4)

# Emulated hosts (MESHTRAIN_EMULATE_HOSTS=1, jobs/local.sh --emulate-hosts) need NCCL: a build
# without it refuses, on every rank alike (exit 2, one message naming the variable).
if(NOT MESHTRAIN_ENABLE_NCCL)
  meshtrain_cli_test(emulate_hosts_needs_nccl 2 2
    "MESHTRAIN_EMULATE_HOSTS .*this is a build without NCCL" selfcheck)
  set_property(TEST cli_emulate_hosts_needs_nccl APPEND PROPERTY ENVIRONMENT
    MESHTRAIN_EMULATE_HOSTS=1)
endif()
# The seeds' workflow (issue 37): a ds_config.json as it is, TensorBoard, `meshtrain doctor`.
include(${CMAKE_CURRENT_SOURCE_DIR}/cli/seeds_cli_tests.cmake)
