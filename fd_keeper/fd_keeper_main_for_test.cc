// A keeper executable for fd_keeper_test: what the daemon's main does when
// argv[1] is kFdKeeperArg.
#include "fd_keeper/fd_keeper.h"

int main(int argc, char** argv) { return pagealloc::RunFdKeeper(argc, argv); }
