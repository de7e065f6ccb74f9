// weft/rendezvous.h: how the processes of a job find each other's store, rank and size.
//
// rendezvous() turns a store URL into a connected Store, checks that every rank of the job
// arrived, and says which rank this process is:
//
//   env://                                  the launcher's environment: torchrun or weftrun
//                                           (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...),
//                                           then Slurm (srun), then Open MPI (mpirun)
//   tcp://HOST:PORT?rank=R&world_size=N     a TCP store at HOST:PORT; rank 0 hosts it
//   file:///PATH?rank=R&world_size=N        a FileStore on PATH (one host or a shared filesystem)
//
// Under torchrun and weftrun (TORCHELASTIC_USE_AGENT_STORE=True) the launcher already hosts the
// store, and rank 0 connects to it as a client. Otherwise rank 0 binds MASTER_ADDR:MASTER_PORT
// itself: a loopback MASTER_ADDR keeps the store on loopback. docs/launching.md has the details,
// including the port derived from the job id under Slurm and Open MPI.
//
//   weft::Rendezvous rdzv = weft::rendezvous();  // under weftrun, torchrun, srun, mpirun
//   rdzv.store->set("hello/" + std::to_string(rdzv.rank), "hi");
//
// Errors: Error(InvalidArgument) for a malformed URL or environment (naming the variable);
// Error(Timeout) when not every rank arrives in time, naming how many did and which are missing;
// Error(Io) when rank 0 cannot bind the store's port.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "weft/store.h"
#include "weft/tcp_store_server.h"

namespace weft {

struct RendezvousOptions {
  // env://, tcp://HOST:PORT[?rank=R&world_size=N] or file:///PATH[?rank=R&world_size=N].
  std::string url = "env://";
  // Override the URL's or environment's values; a URL that gives a different value is an error.
  // (Initialised explicitly so that designated initializers may leave them out under -Wextra.)
  std::optional<int> rank = std::nullopt;
  std::optional<int> world_size = std::nullopt;
  // How long to wait for the store and for every rank to arrive; also the store's default
  // timeout afterwards. 0: WEFT_TIMEOUT (default 300 s).
  std::chrono::milliseconds timeout{0};
};

// The outcome of a rendezvous. Move-only: it may own the store's server.
//
// Ownership: when this process hosts the store (rank 0 outside torchrun/weftrun), `server` owns
// it, and every rank's `store` stops working once it is destroyed; keep rank 0's Rendezvous
// alive until the other ranks are done with the store.
struct Rendezvous {
  // Declared first so that it is destroyed last, after this process's own client.
  std::unique_ptr<TcpStoreServer> server;
  std::shared_ptr<Store> store;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // rank among the processes on this host
  int local_world_size = 1;  // processes on this host

  Rendezvous() = default;
  Rendezvous(Rendezvous&&) noexcept = default;
  Rendezvous& operator=(Rendezvous&&) noexcept = default;
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;
};

// Connects to (or, for rank 0, hosts) the store the options name, and returns once all
// world_size ranks have joined. Sets the rank shown in weft's log lines.
Rendezvous rendezvous(const RendezvousOptions& options = {});

}  // namespace weft
