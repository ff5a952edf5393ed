# meshtrain plan / bench: the table, JSON, the INI round trip into `meshtrain train`, the Slurm
# script, validation on 2 ranks, and the calibration benchmark (included by cli_tests.cmake).
set(_plan_dir ${CMAKE_BINARY_DIR}/cli_plan)
file(MAKE_DIRECTORY ${_plan_dir})
meshtrain_cli_test(plan_help 0 0 "plan\\.calibration" plan --help)
meshtrain_cli_test(plan_gpt2_1_5b_64 0 0 "seeds' rule for this case: multi-node.*  1  [0-9]+x[0-9]+x[0-9]+ z[0-3]"
  plan --model.preset gpt2-1.5b --plan.world 64 --plan.top 5)
meshtrain_cli_test(plan_json 0 0 "\"layouts\": \\[.*\"tokens_per_s\""
  plan --model.preset gpt2-124m --plan.world 8 --plan.top 2 --plan.json -)
meshtrain_cli_test(plan_bad_calibration 0 2 "calibration file 'nope.json' \\(plan.calibration\\)"
  plan --plan.calibration nope.json)
meshtrain_cli_test(plan_nothing_fits 0 0 "no layout fits" plan --model.preset gpt2-1.5b
  --plan.world 1 --plan.memory_gib 4)
# The chosen layout of a 2-rank CPU plan, written as INI and a job script, then trained.
set(_plan_model --model.preset demo --model.n_layer 2 --model.n_embd 32 --model.n_head 2
    --model.block_size 32)
meshtrain_cli_test(plan_emit 0 0 "wrote .*plan.ini.*wrote .*job.sh" plan ${_plan_model}
  --plan.world 2 --plan.gpus_per_node 2 --plan.global_batch 4 --plan.calibration inputs/plan/cpu.json
  --plan.emit_config ${_plan_dir}/plan.ini --plan.emit_slurm ${_plan_dir}/job.sh)
set_tests_properties(cli_plan_emit PROPERTIES FIXTURES_SETUP plan_ini)
meshtrain_cli_test(plan_ini_trains 2 0 "layout: dp [0-9].*step +2/2" train --config ${_plan_dir}/plan.ini
  --train.steps 2 --train.warmup 1 --train.eval_batches 1 --train.sample_tokens 0 --train.save false
  --data.train ${CMAKE_BINARY_DIR}/cli_prep/kjv_train_*.bin
  --data.val ${CMAKE_BINARY_DIR}/cli_prep/kjv_val_*.bin --train.out_dir ${_plan_dir}/train)
set_tests_properties(cli_plan_ini_trains PROPERTIES FIXTURES_REQUIRED "plan_ini;kjv_shards")
# plan.precision=fp8: the 8B shape's layout with its FP8 GEMMs and casts in the detail line; the
# fp8.* options need it; a CPU plan's INI trains in fp8 (the emulated FP8 GEMMs of the CPU build).
meshtrain_cli_test(plan_fp8 0 0 "bf16 \\+ fp8 linears \\(tensorwise\\).*of which FP8 [0-9.]+.*FP8 casts [0-9.]+"
  plan --model.preset llama3.1-8b --model.n_layer 4 --plan.world 1 --plan.seq_len 4096
  --plan.global_batch 1 --plan.micro_batches 1 --plan.zero 0 --plan.precision fp8 --plan.top 1)
meshtrain_cli_test(plan_fp8_needs_precision 0 2 "fp8.recipe needs plan.precision=fp8 \\(it is bf16\\)"
  plan --plan.precision bf16 --fp8.recipe rowwise)
meshtrain_cli_test(plan_fp8_emit 0 0 "fp32 \\+ fp8 linears.*wrote .*plan_fp8.ini" plan ${_plan_model}
  --plan.world 2 --plan.gpus_per_node 2 --plan.global_batch 4 --plan.calibration inputs/plan/cpu.json
  --plan.precision fp8 --fp8.wgrad_bf16 true --plan.emit_config ${_plan_dir}/plan_fp8.ini)
set_tests_properties(cli_plan_fp8_emit PROPERTIES FIXTURES_SETUP plan_fp8_ini)
meshtrain_cli_test(plan_fp8_ini_trains 2 0 "FP8 [0-9]+% of FLOPs.*step +2/2" train
  --config ${_plan_dir}/plan_fp8.ini --train.steps 2 --train.warmup 1 --train.eval_batches 1
  --train.sample_tokens 0 --train.save false --train.log_every 1
  --data.train ${CMAKE_BINARY_DIR}/cli_prep/kjv_train_*.bin
  --data.val ${CMAKE_BINARY_DIR}/cli_prep/kjv_val_*.bin --train.out_dir ${_plan_dir}/train_fp8)
set_tests_properties(cli_plan_fp8_ini_trains PROPERTIES FIXTURES_REQUIRED "plan_fp8_ini;kjv_shards")
meshtrain_cli_test(plan_validate_2 2 0 "median absolute percentage error.*calibration scales now"
  plan ${_plan_model} --plan.gpus_per_node 2 --plan.global_batch 4 --plan.calibration inputs/plan/cpu.json
  --plan.calibration_out ${_plan_dir}/refit.json --plan.validate 2 --plan.validate_steps 2)
meshtrain_cli_test(bench_2 2 0 "slowdown by busy ranks \\{1: 1, 2: [0-9.]+\\}.*wrote .*bench.json" bench ${_plan_model}
  --bench.micro_batches 1,2 --bench.tp 1 --bench.reps 2 --bench.out ${_plan_dir}/bench.json)
