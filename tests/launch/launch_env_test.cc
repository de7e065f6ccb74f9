// parse_launch_env, expand_slurm_nodelist and parse_store_url against synthetic environments.
#include "runtime/launch_env.h"

#include <map>
#include <string>

#include <catch2/catch.hpp>

#include "weft/error.h"

namespace weft {
namespace {

using Env = std::map<std::string, std::string>;

LaunchInfo parse(const Env& env) {
  return parse_launch_env([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

// The message of the InvalidArgument error that parsing `env` throws ("" when none is thrown).
std::string parse_error(const Env& env) {
  try {
    parse(env);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    return e.what();
  }
  return "";
}

std::string url_error(const std::string& url) {
  try {
    parse_store_url(url);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    return e.what();
  }
  return "";
}

const Env kTorchrun = {{"RANK", "5"},
                       {"WORLD_SIZE", "8"},
                       {"LOCAL_RANK", "1"},
                       {"LOCAL_WORLD_SIZE", "4"},
                       {"MASTER_ADDR", "10.1.2.3"},
                       {"MASTER_PORT", "29501"},
                       {"TORCHELASTIC_USE_AGENT_STORE", "True"}};

const Env kSlurm = {{"SLURM_PROCID", "6"},
                    {"SLURM_NTASKS", "7"},
                    {"SLURM_LOCALID", "0"},
                    {"SLURM_NODEID", "3"},
                    {"SLURM_JOB_ID", "123456"},
                    {"SLURM_JOB_NODELIST", "gpu[07-09],cpu1"},
                    {"SLURM_TASKS_PER_NODE", "2(x3),1"}};

const Env kOpenMpiLocal = {{"OMPI_COMM_WORLD_RANK", "2"},
                           {"OMPI_COMM_WORLD_SIZE", "4"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                           {"OMPI_MCA_ess_base_jobid", "3735814145"}};

Env with(Env env, const Env& changes) {
  for (const auto& [name, value] : changes) env[name] = value;
  return env;
}

Env without(Env env, const std::string& name) {
  env.erase(name);
  return env;
}

TEST_CASE("torchrun variables give rank, sizes, store address and the agent store", "[launch]") {
  LaunchInfo info = parse(kTorchrun);
  CHECK(info.source == "torchrun");
  CHECK(info.rank == 5);
  CHECK(info.world_size == 8);
  CHECK(info.local_rank == 1);
  CHECK(info.local_world_size == 4);
  CHECK(info.master_addr == "10.1.2.3");
  CHECK(info.master_port == 29501);
  CHECK(info.agent_store);
  CHECK_FALSE(parse(with(kTorchrun, {{"TORCHELASTIC_USE_AGENT_STORE", "False"}})).agent_store);
  CHECK_FALSE(parse(without(kTorchrun, "TORCHELASTIC_USE_AGENT_STORE")).agent_store);
}

TEST_CASE("torchrun variables without LOCAL_* put every rank on this host", "[launch]") {
  LaunchInfo info = parse(without(without(kTorchrun, "LOCAL_RANK"), "LOCAL_WORLD_SIZE"));
  CHECK(info.local_rank == 5);
  CHECK(info.local_world_size == 8);
}

TEST_CASE("a rank outside the world size is refused naming both variables", "[launch]") {
  std::string message = parse_error(with(kTorchrun, {{"RANK", "8"}}));
  CHECK_THAT(message, Catch::Contains("RANK=8 is out of range for WORLD_SIZE=8"));
  CHECK_THAT(message, Catch::Contains("0..7"));
  CHECK_THAT(parse_error(with(kTorchrun, {{"LOCAL_RANK", "4"}})),
             Catch::Contains("LOCAL_RANK=4 is out of range for LOCAL_WORLD_SIZE=4"));
  CHECK_THAT(parse_error(with(kTorchrun, {{"LOCAL_WORLD_SIZE", "9"}})),
             Catch::Contains("LOCAL_WORLD_SIZE=9 is larger than WORLD_SIZE=8"));
}

TEST_CASE("malformed or missing torchrun values are refused naming the variable", "[launch]") {
  CHECK_THAT(parse_error(with(kTorchrun, {{"RANK", "two"}})),
             Catch::Contains("RANK='two' is not an integer"));
  CHECK_THAT(parse_error(with(kTorchrun, {{"WORLD_SIZE", "0"}})),
             Catch::Contains("WORLD_SIZE=0 is out of range"));
  CHECK_THAT(parse_error(with(kTorchrun, {{"WORLD_SIZE", "8x"}})),
             Catch::Contains("WORLD_SIZE='8x' is not an integer"));
  CHECK_THAT(parse_error(with(kTorchrun, {{"MASTER_PORT", "70000"}})),
             Catch::Contains("MASTER_PORT=70000 is out of range (expected a TCP port, 1..65535)"));
  CHECK_THAT(parse_error(with(kTorchrun, {{"MASTER_ADDR", ""}})),
             Catch::Contains("MASTER_ADDR is set but empty"));
  CHECK_THAT(parse_error(without(kTorchrun, "WORLD_SIZE")),
             Catch::Contains("WORLD_SIZE is not set"));
  CHECK_THAT(parse_error(without(kTorchrun, "RANK")), Catch::Contains("RANK is not set"));
  CHECK_THAT(parse_error(without(kTorchrun, "MASTER_ADDR")),
             Catch::Contains("MASTER_ADDR is not set"));
  CHECK_THAT(parse_error(without(kTorchrun, "MASTER_PORT")),
             Catch::Contains("MASTER_PORT is not set"));
}

TEST_CASE("an environment with no launcher variables is refused listing the conventions",
          "[launch]") {
  std::string message = parse_error({{"HOME", "/root"}});
  CHECK_THAT(message, Catch::Contains("RANK and WORLD_SIZE"));
  CHECK_THAT(message, Catch::Contains("SLURM_PROCID"));
  CHECK_THAT(message, Catch::Contains("OMPI_COMM_WORLD_RANK"));
}

TEST_CASE("Slurm variables give the first host and a port derived from the job id", "[launch]") {
  LaunchInfo info = parse(kSlurm);
  CHECK(info.source == "slurm");
  CHECK(info.rank == 6);
  CHECK(info.world_size == 7);
  CHECK(info.local_rank == 0);
  CHECK(info.local_world_size == 1);  // node 3 of "2(x3),1"
  CHECK(info.master_addr == "gpu07");
  CHECK(info.master_port == 10000 + 123456 % 20000);
  CHECK(info.master_port == 13456);
  CHECK_FALSE(info.agent_store);
  CHECK(parse(with(kSlurm, {{"SLURM_NODEID", "1"}, {"SLURM_PROCID", "3"}, {"SLURM_LOCALID", "1"}}))
            .local_world_size == 2);
}

TEST_CASE("Slurm prefers the step's node list and tasks per node to the job's", "[launch]") {
  LaunchInfo info = parse(with(kSlurm, {{"SLURM_STEP_NODELIST", "cpu1,gpu[07-09]"},
                                        {"SLURM_STEP_TASKS_PER_NODE", "1,2(x3)"}}));
  CHECK(info.master_addr == "cpu1");
  CHECK(info.local_world_size == 2);
}

TEST_CASE("Slurm on one node keeps the store on loopback", "[launch]") {
  LaunchInfo info = parse(with(
      kSlurm,
      {{"SLURM_JOB_NODELIST", "node17"}, {"SLURM_TASKS_PER_NODE", "7"}, {"SLURM_NODEID", "0"}}));
  CHECK(info.master_addr == "127.0.0.1");
  CHECK(info.local_world_size == 7);
}

TEST_CASE("MASTER_ADDR and MASTER_PORT override Slurm's derived store address", "[launch]") {
  LaunchInfo info = parse(with(kSlurm, {{"MASTER_ADDR", "login3"}, {"MASTER_PORT", "4000"}}));
  CHECK(info.source == "slurm");
  CHECK(info.master_addr == "login3");
  CHECK(info.master_port == 4000);
  CHECK(parse(with(without(kSlurm, "SLURM_JOB_ID"), {{"SLURM_JOBID", "40001"}})).master_port ==
        10001);
}

TEST_CASE("Slurm without a job id or node list is refused naming what is missing", "[launch]") {
  CHECK_THAT(parse_error(without(kSlurm, "SLURM_JOB_ID")),
             Catch::Contains("neither MASTER_PORT nor SLURM_JOB_ID is set"));
  CHECK_THAT(parse_error(without(kSlurm, "SLURM_JOB_NODELIST")),
             Catch::Contains("neither MASTER_ADDR nor SLURM_STEP_NODELIST"));
  CHECK_THAT(parse_error(with(kSlurm, {{"SLURM_PROCID", "7"}})),
             Catch::Contains("SLURM_PROCID=7 is out of range for SLURM_NTASKS=7"));
  CHECK_THAT(parse_error(without(kSlurm, "SLURM_LOCALID")),
             Catch::Contains("SLURM_LOCALID is not set"));
  CHECK_THAT(parse_error(with(kSlurm, {{"SLURM_TASKS_PER_NODE", "2(x3"}})),
             Catch::Contains("SLURM_TASKS_PER_NODE"));
}

TEST_CASE("Open MPI on one host uses loopback and a port from the 4.x job id", "[launch]") {
  LaunchInfo info = parse(kOpenMpiLocal);
  CHECK(info.source == "openmpi");
  CHECK(info.rank == 2);
  CHECK(info.world_size == 4);
  CHECK(info.local_rank == 2);
  CHECK(info.local_world_size == 4);
  CHECK(info.master_addr == "127.0.0.1");
  CHECK(info.master_port == 10000 + 3735814145ull % 20000);
}

TEST_CASE("Open MPI 5 derives the same port on every rank from the PMIx namespace", "[launch]") {
  Env env = with(without(kOpenMpiLocal, "OMPI_MCA_ess_base_jobid"),
                 {{"PMIX_NAMESPACE", "prterun-host-4242@1"}});
  uint16_t port = parse(env).master_port;
  CHECK(port >= 10000);
  CHECK(port < 30000);
  CHECK(parse(with(env, {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}}))
            .master_port == port);
  CHECK(parse(with(env, {{"PMIX_NAMESPACE", "prterun-host-4243@1"}})).master_port != port);
  CHECK_THAT(parse_error(without(env, "PMIX_NAMESPACE")),
             Catch::Contains("neither MASTER_PORT nor OMPI_MCA_ess_base_jobid"));
}

TEST_CASE("Open MPI across hosts needs MASTER_ADDR and uses it when set", "[launch]") {
  Env multi = with(kOpenMpiLocal, {{"OMPI_COMM_WORLD_SIZE", "8"}});
  CHECK_THAT(parse_error(multi), Catch::Contains("MASTER_ADDR is not set and the job spans"));
  LaunchInfo info = parse(with(multi, {{"MASTER_ADDR", "node3"}}));
  CHECK(info.master_addr == "node3");
  CHECK(info.world_size == 8);
  CHECK(info.local_world_size == 4);
  CHECK_THAT(parse_error(without(kOpenMpiLocal, "OMPI_COMM_WORLD_LOCAL_SIZE")),
             Catch::Contains("OMPI_COMM_WORLD_LOCAL_SIZE is not set"));
}

TEST_CASE("torchrun variables win over Slurm, and Slurm over Open MPI", "[launch]") {
  Env all = with(with(kTorchrun, kSlurm), kOpenMpiLocal);
  CHECK(parse(all).source == "torchrun");
  CHECK(parse(all).rank == 5);
  Env slurm_mpi = with(kSlurm, kOpenMpiLocal);
  CHECK(parse(slurm_mpi).source == "slurm");
  CHECK(parse(slurm_mpi).rank == 6);
  // A half-set convention is an error, not a silent fall-through to the next one.
  CHECK_THAT(parse_error(without(all, "RANK")), Catch::Contains("RANK is not set"));
}

TEST_CASE("each launcher's job id is found, WEFT_JOB_ID first and the launcher's own next",
          "[launch]") {
  CHECK(parse(kTorchrun).job.empty());
  CHECK(parse(kTorchrun).job.text() == "no job id");
  CHECK(parse(with(kTorchrun, {{"TORCHELASTIC_RUN_ID", "r7"}})).job.text() ==
        "TORCHELASTIC_RUN_ID=r7");
  CHECK(parse(kSlurm).job.text() == "SLURM_JOB_ID=123456");
  // Two steps of one allocation are two jobs.
  CHECK(parse(with(kSlurm, {{"SLURM_STEP_ID", "2"}})).job.text() ==
        "SLURM_JOB_ID.SLURM_STEP_ID=123456.2");
  CHECK(parse(kOpenMpiLocal).job.text() == "OMPI_MCA_ess_base_jobid=3735814145");
  CHECK(parse(with(without(kOpenMpiLocal, "OMPI_MCA_ess_base_jobid"),
                   {{"PMIX_NAMESPACE", "prterun-h-1@1"}, {"MASTER_PORT", "1"}}))
            .job.text() == "PMIX_NAMESPACE=prterun-h-1@1");
  // weftrun's (or a hand launch's) WEFT_JOB_ID wins over any launcher's id.
  CHECK(parse(with(kSlurm, {{"WEFT_JOB_ID", "mine"}})).job.text() == "WEFT_JOB_ID=mine");
  // Under Slurm, torchrun's id tells two torchrun jobs of one allocation apart.
  Env torchrun_in_slurm = with(kTorchrun, {{"TORCHELASTIC_RUN_ID", "r7"}, {"SLURM_JOB_ID", "9"}});
  CHECK(parse(torchrun_in_slurm).job.text() == "TORCHELASTIC_RUN_ID=r7");
}

TEST_CASE("Slurm node lists expand ranges, keep zero padding and multiply bracket groups",
          "[launch]") {
  using V = std::vector<std::string>;
  CHECK(expand_slurm_nodelist("node[01-03,07],gpu5") ==
        V{"node01", "node02", "node03", "node07", "gpu5"});
  CHECK(expand_slurm_nodelist("n[8-11]") == V{"n8", "n9", "n10", "n11"});
  CHECK(expand_slurm_nodelist("n[098-101]") == V{"n098", "n099", "n100", "n101"});
  CHECK(expand_slurm_nodelist("rack[1-2]-n[1-2]") ==
        V{"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"});
  CHECK(expand_slurm_nodelist("a,b[3],c") == V{"a", "b3", "c"});
  CHECK(expand_slurm_nodelist("single") == V{"single"});
}

TEST_CASE("malformed Slurm node lists are refused with the list in the message", "[launch]") {
  for (const char* bad :
       {"node[1-3", "node1-3]", "node[3-1]", "node[]", "a,,b", "", "n[a-b]", "n[[1]]"}) {
    INFO(bad);
    try {
      expand_slurm_nodelist(bad);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::InvalidArgument);
      CHECK_THAT(e.what(), Catch::Contains("Slurm node list"));
    }
  }
}

TEST_CASE("the derived port stays in 10000..29999", "[launch]") {
  CHECK(derived_store_port(0) == 10000);
  CHECK(derived_store_port(19999) == 29999);
  CHECK(derived_store_port(20000) == 10000);
  CHECK(derived_store_port(UINT64_MAX) == 10000 + UINT64_MAX % 20000);
}

TEST_CASE("the store binds loopback and IP literals as given, host names on all interfaces",
          "[launch]") {
  CHECK(store_bind_address("127.0.0.1") == "127.0.0.1");
  CHECK(store_bind_address("localhost") == "localhost");
  CHECK(store_bind_address("::1") == "::1");
  CHECK(store_bind_address("10.0.0.7") == "10.0.0.7");
  CHECK(store_bind_address("fe80::1") == "fe80::1");
  CHECK(store_bind_address("node01") == "0.0.0.0");
}

TEST_CASE("store URLs parse into scheme, address, path, rank and world size", "[launch]") {
  StoreUrl env = parse_store_url("env://");
  CHECK(env.scheme == StoreUrl::Scheme::Env);
  CHECK_FALSE(env.rank);

  StoreUrl tcp = parse_store_url("tcp://10.0.0.1:29500?rank=3&world_size=4");
  CHECK(tcp.scheme == StoreUrl::Scheme::Tcp);
  CHECK(tcp.host == "10.0.0.1");
  CHECK(tcp.port == 29500);
  CHECK(tcp.rank == 3);
  CHECK(tcp.world_size == 4);

  StoreUrl v6 = parse_store_url("tcp://[::1]:1234");
  CHECK(v6.host == "::1");
  CHECK(v6.port == 1234);
  CHECK_FALSE(v6.world_size);

  StoreUrl file = parse_store_url("file:///tmp/weft store?world_size=2&rank=0");
  CHECK(file.scheme == StoreUrl::Scheme::File);
  CHECK(file.path == "/tmp/weft store");
  CHECK(file.rank == 0);
  CHECK(file.world_size == 2);
}

TEST_CASE("malformed store URLs are refused naming the URL and the part that is wrong",
          "[launch]") {
  CHECK_THAT(url_error("http://x:1"), Catch::Contains("unknown scheme"));
  CHECK_THAT(url_error("tcp://host"), Catch::Contains("no port"));
  CHECK_THAT(url_error("tcp://:29500"), Catch::Contains("no host"));
  CHECK_THAT(url_error("tcp://host:0"), Catch::Contains("1..65535"));
  CHECK_THAT(url_error("tcp://host:65536"), Catch::Contains("1..65535"));
  CHECK_THAT(url_error("tcp://[::1:5"), Catch::Contains("unclosed '['"));
  CHECK_THAT(url_error("file://relative/path"), Catch::Contains("must be absolute"));
  CHECK_THAT(url_error("env://host"), Catch::Contains("env:// takes no host"));
  CHECK_THAT(url_error("tcp://h:1?rank=x"), Catch::Contains("'rank=x' is not rank=R"));
  CHECK_THAT(url_error("tcp://h:1?world_size=0"), Catch::Contains("world_size=N with N >= 1"));
  CHECK_THAT(url_error("tcp://h:1?size=2"), Catch::Contains("unknown parameter 'size'"));
  CHECK_THAT(url_error("tcp://h:1?rank=2&world_size=2"),
             Catch::Contains("rank=2 is out of range for world_size=2"));
  CHECK_THAT(url_error("tcp://h:1?rank=2&world_size=2"), Catch::Contains("tcp://h:1"));
}

}  // namespace
}  // namespace weft
