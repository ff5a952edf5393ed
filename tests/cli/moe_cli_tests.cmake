# Mixture of Experts on the command line (issue 20): each bad configuration is one message naming
# the option and exit 2 on every rank; a 2-rank run with mesh.ep 2 trains and logs the moe field;
# in the CUDA build, bf16 and fp16 MoE runs.
# Uses meshtrain_cli_test and _train_small of cli_tests.cmake.
set(_moe_base ${_train_base} --model.n_layer 2 --model.n_head 2 --moe.ffn_hidden_size 32
    --train.sample_tokens 0 --train.save false)
set(_moe ${_moe_base} --moe.experts 4)
meshtrain_cli_test(moe_help 0 0 "moe\\.experts.*moe\\.top_k.*moe\\.capacity_factor.*mesh\\.ep"
  train --help)
meshtrain_cli_test(moe_bad_ep 2 2 "moe\\.experts=3 is not divisible by mesh\\.ep=2" train
  ${_moe_base} --moe.experts 3 --mesh.ep 2)
meshtrain_cli_test(moe_bad_top_k 2 2 "moe\\.top_k=5 must be in \\[1, min\\(8, moe\\.experts=4\\)\\]"
  train ${_moe} --moe.top_k 5)
meshtrain_cli_test(moe_bad_world 2 2 "mesh\\.ep x mesh\\.tp x mesh\\.pp = 4 x 1 x 1 does not divide the 2 ranks"
  train ${_moe} --mesh.ep 4)
meshtrain_cli_test(moe_bad_capacity 2 2 "moe\\.capacity_factor=0 must be > 0" train ${_moe}
  --moe.capacity_factor 0)
meshtrain_cli_test(moe_bad_capacity_negative 2 2 "moe\\.capacity_factor=-1 must be > 0"
  train ${_moe} --moe.capacity_factor -1)
meshtrain_cli_test(moe_ep_dense 2 2 "mesh\\.ep=2 needs a Mixture-of-Experts model" train
  ${_train_small} --train.sample_tokens 0 --train.save false --mesh.ep 2)
meshtrain_cli_test(moe_train_ep2 2 0 "step +3/3 .*\\| moe aux [0-9.]+ z [0-9.]+ cv [0-9.]+ drop [0-9.]+% a2a"
  train ${_moe} --mesh.ep 2 --moe.z_loss_coeff 0.001 --moe.shared_expert_size 16
  --train.out_dir ${CMAKE_BINARY_DIR}/cli_train_moe)
meshtrain_cli_test(moe_bad_expert_bias 2 2 "moe\\.expert_bias needs moe\\.router_score=sigmoid"
  train ${_moe} --moe.expert_bias)
meshtrain_cli_test(moe_bad_expert_bias_rate 2 2 "moe\\.expert_bias_rate=-1 must be >= 0"
  train ${_moe} --moe.router_score sigmoid --moe.expert_bias --moe.expert_bias_rate -1)
# The sigmoid router with the expert bias trains under ep 2 (test_moe_layouts and
# test_moe_resume check the biases across layouts and checkpoints).
meshtrain_cli_test(moe_train_expert_bias 2 0 "step +3/3 .*\\| moe aux [0-9.]+ z [0-9.]+ cv [0-9.]+"
  train ${_moe} --mesh.ep 2 --moe.router_score sigmoid --moe.expert_bias
  --moe.expert_bias_rate 0.01 --train.out_dir ${CMAKE_BINARY_DIR}/cli_train_moe_bias)
foreach(t moe_bad_ep moe_bad_top_k moe_bad_world moe_bad_capacity moe_bad_capacity_negative
          moe_ep_dense moe_train_ep2 moe_bad_expert_bias moe_bad_expert_bias_rate
          moe_train_expert_bias)
  set_tests_properties(cli_${t} PROPERTIES FIXTURES_REQUIRED kjv_shards)
endforeach()
# 16-bit MoE (the CUDA build, where the types exist; the CPU build refuses train.precision bf16
# for every model, cli_train_bf16_on_cpu): bf16 with Llama blocks (SwiGLU experts), fp16 with
# GPT-2 blocks and a shared expert under dynamic loss scaling (train.loss_scaling=auto).
if(MESHTRAIN_ENABLE_CUDA)
  meshtrain_cli_test(moe_train_bf16 1 0 "step +3/3 .*\\| moe aux [0-9.]+ z [0-9.]+ cv"
    train ${_moe} --model.preset llama-tiny --train.precision bf16 --moe.z_loss_coeff 0.001
    --train.out_dir ${CMAKE_BINARY_DIR}/cli_train_moe_bf16)
  meshtrain_cli_test(moe_train_fp16 1 0 "step +3/3 .*\\| scale [0-9]+.*\\| moe aux [0-9.]+ z"
    train ${_moe} --train.precision fp16 --moe.shared_expert_size 16
    --train.out_dir ${CMAKE_BINARY_DIR}/cli_train_moe_fp16)
  set_tests_properties(cli_moe_train_bf16 cli_moe_train_fp16 PROPERTIES
    FIXTURES_REQUIRED kjv_shards)
endif()
# train.save writes MixtralForCausalLM (tests/cli/test_resume.sh convert_mixtral); what Mixtral
# cannot express is refused before training, naming the option.
meshtrain_cli_test(moe_no_export_gpt2 1 2 "train\\.save=true.*model\\.family=gpt2 has GELU experts"
  train ${_train_base} --model.n_layer 2 --model.n_head 2 --moe.experts 4 --train.sample_tokens 0)
meshtrain_cli_test(moe_no_export_capacity 2 2 "train\\.save=true.*moe\\.capacity_factor=1\\.5: Mixtral is dropless"
  train ${_train_base} --model.preset llama-tiny --model.n_layer 1 --moe.experts 4
  --moe.capacity_factor 1.5 --train.sample_tokens 0)
meshtrain_cli_test(moe_no_export_shared 1 2 "moe\\.shared_expert_size=16: Mixtral has no shared expert"
  train ${_train_base} --model.preset llama-tiny --model.n_layer 1 --moe.experts 4
  --moe.shared_expert_size 16 --train.sample_tokens 0)
foreach(t moe_no_export_gpt2 moe_no_export_capacity moe_no_export_shared)
  set_tests_properties(cli_${t} PROPERTIES FIXTURES_REQUIRED kjv_shards)
endforeach()
# The planner searches mesh.ep for an MoE model and writes it into the layout's INI.
meshtrain_cli_test(moe_plan 0 0 "  1  [0-9]+x[0-9]+x[0-9]+ ep[0-9]+ .*wrote .*moe_plan\\.ini" plan
  --model.preset gpt2-124m --moe.experts 64 --plan.world 16 --plan.gpus_per_node 8
  --plan.global_batch 64 --plan.memory_gib 80 --plan.top 3
  --plan.emit_config ${CMAKE_BINARY_DIR}/moe_plan.ini)
