#pragma once
// `meshtrain train`'s checks before step 1 (issue 17): every rank reads the data it will train
// on and tries every place it will write, and the ranks agree on the outcome (core/agree.hpp),
// so a shard that one node cannot read or a folder one rank cannot write is one message naming
// the file and the rank, and exit 2 on every rank, instead of a hang or a run lost at its
// first save.
#include <mpi.h>

#include <memory>
#include <string>

#include "meshtrain/comm/watchdog.hpp"
#include "meshtrain/core/config.hpp"
#include "meshtrain/io/blend.hpp"
#include "meshtrain/io/dataset.hpp"
#include "meshtrain/train/trainer.hpp"

namespace meshtrain::app {

namespace po = boost::program_options;

struct OutputLocations {
  std::string out_dir;       // train.out_dir: every rank (model export, flight dumps)
  std::string metrics_file;  // train.metrics: world rank 0, the only writer
  std::string ckpt_dir;      // ckpt.dir: every rank (MPI-IO); empty: no checkpoints
};

// Collective over `world`: creates out_dir and ckpt_dir where missing and, on every rank,
// creates and removes a file in each; opens the metrics file for appending on rank 0.
void preflight_outputs(MPI_Comm world, const OutputLocations& o);

struct TrainData {
  std::unique_ptr<io::TokenDataset> train, val;  // val: null without data.val
  // data.blend: the sources and their datasets (val: null where a source has no val shards).
  std::vector<io::BlendSourceSpec> blend;
  std::vector<std::unique_ptr<io::TokenDataset>> blend_train, blend_val;
  // What the trainer reads: the blend, or data.train with data.val.
  io::BlendedDataset dataset() const;
};
// Collective over `world`: every rank opens and checks its shards (header, size, vocabulary).
TrainData load_data(MPI_Comm world, const std::string& train_glob, const std::string& val_glob,
                    int seq_len, int vocab_size);
// The same for a blend: each source's training shards, and its validation shards where they
// exist and `with_val` (a source without any is named in a warning).
TrainData load_blend(MPI_Comm world, const std::vector<io::BlendSourceSpec>& blend, bool with_val,
                     int seq_len, int vocab_size);

// The watchdog's settings from comm.timeout (0: no watchdog and no flight recording); `world`
// is the job the watchdog aborts and whose ranks name the processes.
comm::WatchdogConfig watchdog_config(const po::variables_map& vm, const std::string& out_dir,
                                     MPI_Comm world);

// Fault injection of the CLI tests, from MESHTRAIN_TEST_* variables (README of tests/cli):
// MESHTRAIN_TEST_COLLECTIVE=stall|skip:<world rank>:<communicator>:<sequence number> and
// MESHTRAIN_TEST_NAN_BATCH=<batch>. Malformed values are ConfigErrors.
void collective_fault_from_env();
std::int64_t nan_batch_from_env();
// Every hook of core/fault_injection.hpp from its MESHTRAIN_TEST_* variable (an unset variable
// leaves the hook off; a malformed one is a ConfigError, not a silent no-op).
void set_fault_hooks();

}  // namespace meshtrain::app
