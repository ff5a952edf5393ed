# --deepspeed, `meshtrain config`, TensorBoard and `meshtrain doctor` (issue 37).
set(_seeds tests/cli/deepspeed)
# Seed 002's ds_config.json as written, for its launch (8 GPUs, tp 2, pp 4): the INI it means.
meshtrain_cli_test(config_seed002 0 0
  "\\[mesh\\].dp = 1.pp = 4.tp = 2.\\[tp\\].sequence_parallel = true.\\[train\\].beta1 = 0.9.beta2 = 0.999.eps = 1e-08.grad_accum = 8.loss_scale_hysteresis = 2.lr = 6e-05.lr_schedule = constant.micro_batch = 512.precision = fp16.recompute = true.weight_decay = 0.\\[zero\\].offload_optimizer = cpu.stage = 3.*no effect in meshtrain: activation_checkpointing.contiguous_memory_optimization"
  config --deepspeed ${_seeds}/seed002_ds_config.json --config.world 8 --mesh.tp 2 --mesh.pp 4)
# Seed 000's HF Trainer ZeRO-2 file: "auto" takes meshtrain's values (here the command line's).
meshtrain_cli_test(config_seed000 0 0
  "grad_accum = 2.*lr = 0.0003.lr_schedule = ds_warmup.micro_batch = 4.*warmup_type = log.\\[zero\\].offload_optimizer = cpu.stage = 2"
  config --deepspeed ${_seeds}/seed000_hf_zero2.json --config.world 2 --train.micro_batch 4
  --train.grad_accum 2 --train.lr 3e-4)
# The planner takes the file's global batch, ZeRO stage and precision.
meshtrain_cli_test(plan_seed002 0 0
  "gpt2-124m: .*fp16.cluster: 8 devices.*global batch 4096 sequences.*ZeRO-3"
  plan --deepspeed ${_seeds}/seed002_ds_config.json --plan.world 8 --model.preset gpt2-124m
  --plan.calibration inputs/plan/h200.json --plan.top 3)
# train refuses what the build cannot do, naming the DeepSpeed key; and contradictions.
if(NOT MESHTRAIN_ENABLE_CUDA)
  meshtrain_cli_test(train_seed002_cpu 2 2
    "train.precision=fp16 needs a GPU build .*\\(set by fp16.enabled in .*seed002_ds_config.json, --deepspeed\\)"
    train --deepspeed ${_seeds}/seed002_ds_config.json --train.out_dir ${CMAKE_BINARY_DIR}/cli_ds_bad)
  meshtrain_cli_test(train_profile_nvtx_cpu 1 2 "profile.nvtx needs the CUDA build"
    train --profile.nvtx --train.out_dir ${CMAKE_BINARY_DIR}/cli_ds_bad)
  meshtrain_cli_test(train_profile_steps_cpu 1 2 "profile.steps needs the CUDA build"
    train --profile.steps 2:3 --train.out_dir ${CMAKE_BINARY_DIR}/cli_ds_bad)
endif()
meshtrain_cli_test(train_seed002_batch 2 2
  "train_batch_size=4096 but micro-batch 4 \\(--train.micro_batch on the command line\\) x accumulation 8 .*x dp 2 = 64"
  train --deepspeed ${_seeds}/seed002_ds_config.json --train.micro_batch 4
  --train.out_dir ${CMAKE_BINARY_DIR}/cli_ds_bad)
meshtrain_cli_test(train_profile_steps_bad 1 2 "profile.steps='3:1' must be A:B with 1 <= A <= B"
  train --profile.steps 3:1 --train.out_dir ${CMAKE_BINARY_DIR}/cli_ds_bad)
meshtrain_cli_test(doctor_not_a_run 0 2 "doctor: '.*' has no config.ini: not the train.out_dir of a run"
  doctor ${PROJECT_SOURCE_DIR}/inputs)

# A run from a DeepSpeed file: TensorBoard events read back independently, and the INI that
# `meshtrain config` prints trains the same losses.
set(_seeds_launch ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${MPIEXEC_PREFLAGS} --
    $<TARGET_FILE:meshtrain>)
add_test(NAME cli_deepspeed_equivalent
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_deepspeed.sh equivalent
          ${CMAKE_BINARY_DIR}/cli_deepspeed/equivalent ${CMAKE_BINARY_DIR}/cli_prep/kjv_train_*.bin
          -- ${_seeds_launch})
set_tests_properties(cli_deepspeed_equivalent PROPERTIES PROCESSORS 2 TIMEOUT 300 LABELS cli
  FIXTURES_REQUIRED kjv_shards ENVIRONMENT "${MESHTRAIN_TEST_MPI_ENV}")
# `meshtrain doctor` on a run made to show each finding.
foreach(case bubble unhidden nan stall cp)
  add_test(NAME cli_doctor_${case}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_doctor.sh ${case}
            ${CMAKE_BINARY_DIR}/cli_doctor/${case} ${CMAKE_BINARY_DIR}/cli_prep/kjv_train_*.bin
            -- ${_seeds_launch})
  set(_procs 2)
  if(case STREQUAL bubble)
    set(_procs 4)
  endif()
  set_tests_properties(cli_doctor_${case} PROPERTIES PROCESSORS ${_procs} TIMEOUT 300 LABELS cli
    FIXTURES_REQUIRED kjv_shards ENVIRONMENT "${MESHTRAIN_TEST_MPI_ENV}")
endforeach()
