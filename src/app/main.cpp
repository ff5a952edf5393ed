// The meshtrain executable: a thin driver over the library.
#include "meshtrain/app/subcommands.hpp"

int main(int argc, char** argv) { return meshtrain::app::run_main(argc, argv); }
