// tessera launch --num-replicas R --num-instances P [--ipus-per-replica K] [--timeout S]
//                [--mpi-args "MPIRUN_OPTION..."] [--mpirun PROGRAM] -- COMMAND [ARG...]
//
// PopRun for tessera: runs COMMAND as P instances under mpirun, each told by
// POPDIST_* variables which R / P of the R replicas it simulates (see
// tessera/popdist/dist.hpp); `tessera train` and applications using
// dist::configureSessionOptions pick them up. --mpi-args holds options for
// mpirun, split at spaces (e.g. "--host a,b --tag-output"), like PopRun's
// --mpi-global-args; --oversubscribe is always added so that instances may
// outnumber cores, --bind-to none unless --mpi-args binds (each instance
// then runs on its share of the host's CPUs: TESSERA_NUM_THREADS = CPUs /
// instances on the host, unless set), and --allow-run-as-root when running
// as root.
//
// mpirun gives every instance the same environment, but the replica offset
// differs per instance. So mpirun runs this program again, as a small
// wrapper (the hidden --instance flag) that sets the variables from Open
// MPI's rank and then replaces itself with COMMAND.
//
// The launcher stays the parent of mpirun rather than becoming it, so that
// the signals that stop a run reach the instances as a request to stop at a
// step boundary: mpirun kills its instances on SIGTERM and SIGHUP, but
// forwards SIGUSR1 and SIGUSR2 to every one of them, which `tessera train`
// under the launcher takes as SIGTERM and SIGHUP. mpirun runs in a process
// group of its own (and Open MPI gives each instance one), so Ctrl-C at a
// terminal, which signals the foreground group, reaches the launcher alone:
// it asks the instances to stop like SIGTERM and exits 130. A second signal,
// or the instances still running --timeout seconds after the first, stops
// mpirun, which ends the instances at once; mpirun is killed 5 s later if it
// is still there.
//
// Start-up is bounded too: an instance whose peers do not all start MPI
// within --timeout fails with tessera.dist.507 (popdist's MPI communicator),
// and counts of instances beyond what the machine lets mpirun start
// (instanceLimit) are refused before anything starts.
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli.hpp"
#include "tessera/popdist/dist.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::cli {
namespace {

struct LaunchArgs {
  int64_t replicas = 1;
  int64_t instances = 1;
  int64_t ipusPerReplica = 1;
  std::string timeoutText;      // as given; empty: the instances' default
  double timeoutSeconds = 0.0;  // 0: the instances' default
  std::string mpirun = "mpirun";
  std::string mpiArgs;
  bool instance = false;
  std::vector<std::string> command;
};

std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string word; in >> word;) out.push_back(word);
  return out;
}

// Replaces this process with `argv`; returns only by throwing.
[[noreturn]] void execute(const std::vector<std::string>& argv, std::string_view hint) {
  std::vector<char*> pointers;
  for (const std::string& a : argv) pointers.push_back(const_cast<char*>(a.c_str()));
  pointers.push_back(nullptr);
  ::execvp(pointers.front(), pointers.data());
  throw IoError(ErrorCode::FileUnreadable, argv.front(),
                fmt::format("cannot run it: {}{}", std::strerror(errno), hint));
}

// The running mpirun (0: none yet), the first stop signal the launcher got
// and how many it got.
volatile std::sig_atomic_t mpirunPid = 0;
volatile std::sig_atomic_t receivedSignal = 0;
volatile std::sig_atomic_t signalCount = 0;

void forwardSignal(int signal) {
  const auto pid = static_cast<pid_t>(mpirunPid);
  signalCount = signalCount + 1;
  if (receivedSignal != 0) {
    ::kill(pid, SIGTERM);
    return;
  }
  receivedSignal = signal;
  // SIGINT (Ctrl-C) asks for the same stop at a step boundary as SIGTERM.
  ::kill(pid, signal == SIGHUP ? SIGUSR2 : SIGUSR1);
}

// After a stop signal: how long the instances have to reach a step boundary
// and leave before mpirun is told to end them, and how long mpirun then has
// before it is killed.
struct StopGrace {
  std::chrono::milliseconds instances;
  std::chrono::milliseconds mpirun{5000};
};

// Runs mpirun as a child in a process group of its own with the stop
// signals forwarded as above; returns its exit code (128 + the signal when a
// signal ended it; 130 when Ctrl-C stopped the run).
int runMpirun(const std::vector<std::string>& argv, std::string_view hint, const StopGrace& grace) {
  std::vector<char*> pointers;
  for (const std::string& a : argv) pointers.push_back(const_cast<char*>(a.c_str()));
  pointers.push_back(nullptr);
  constexpr std::array kStopSignals = {SIGINT, SIGTERM, SIGHUP};
  // Blocked until the handlers know mpirun's pid; mpirun starts with the
  // mask the launcher had.
  sigset_t stops;
  sigset_t original;
  sigemptyset(&stops);
  for (const int signal : kStopSignals) sigaddset(&stops, signal);
  ::sigprocmask(SIG_BLOCK, &stops, &original);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setsigmask(&attributes, &original);
  posix_spawnattr_setpgroup(&attributes, 0);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);
  pid_t pid = 0;
  const int error = ::posix_spawnp(&pid, pointers.front(), nullptr, &attributes, pointers.data(), environ);
  posix_spawnattr_destroy(&attributes);
  if (error != 0) {
    ::sigprocmask(SIG_SETMASK, &original, nullptr);
    throw IoError(ErrorCode::FileUnreadable, argv.front(),
                  fmt::format("cannot run it: {}{}", std::strerror(error), hint));
  }
  mpirunPid = pid;
  struct sigaction action {};
  action.sa_handler = forwardSignal;
  action.sa_mask = stops;
  for (const int signal : kStopSignals) ::sigaction(signal, &action, nullptr);
  ::sigprocmask(SIG_SETMASK, &original, nullptr);
  // Polled, so that a stop that takes too long is noticed without a timer.
  using Clock = std::chrono::steady_clock;
  std::optional<Clock::time_point> stopAt;
  bool terminated = false;
  bool killed = false;
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) throw InternalError(ErrorCode::Internal, "mpirun", std::strerror(errno));
    if (receivedSignal != 0) {
      const Clock::time_point now = Clock::now();
      if (!stopAt) stopAt = now;
      if (!terminated && (signalCount > 1 || now - *stopAt >= grace.instances)) {
        ::kill(pid, SIGTERM);
        terminated = true;
        stopAt = now;
      } else if (terminated && !killed && now - *stopAt >= grace.mpirun) {
        ::kill(-pid, SIGKILL);
        killed = true;
      }
    }
    const timespec pause{0, 20'000'000};
    ::nanosleep(&pause, nullptr);
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : exitCodeForSignal(WTERMSIG(status));
  // The instances report a Ctrl-C as the SIGTERM they were sent for it.
  if (receivedSignal == SIGINT && code == exitCodeForSignal(SIGTERM)) return exitCodeForSignal(SIGINT);
  return code;
}

void setVariable(std::string_view name, const std::string& value) {
  ::setenv(std::string(name).c_str(), value.c_str(), 1);
}

// The most instances mpirun may start here. mpirun holds about
// kDescriptorsPerInstance file descriptors per local instance while it starts
// them (pipes for stdin, stdout, stderr and its own start-up channel), and
// every instance is at least kTasksPerInstance of the user's processes and
// threads (the instance, MPI's progress threads, the device's threads); past
// RLIMIT_NOFILE or RLIMIT_NPROC mpirun fails part-way. kMaxInstances caps it
// where neither limit is set.
constexpr int64_t kMaxInstances = 4096;
constexpr int64_t kDescriptorsPerInstance = 8;
constexpr int64_t kReservedDescriptors = 64;
constexpr int64_t kTasksPerInstance = 4;

int64_t softLimit(int resource) {
  rlimit limit{};
  if (::getrlimit(resource, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return -1;
  return static_cast<int64_t>(std::min<rlim_t>(limit.rlim_cur, rlim_t{1} << 40));
}

int64_t instanceLimit() {
  int64_t limit = kMaxInstances;
  if (const int64_t files = softLimit(RLIMIT_NOFILE); files >= 0)
    limit = std::min(limit, std::max<int64_t>((files - kReservedDescriptors) / kDescriptorsPerInstance, 1));
  if (const int64_t tasks = softLimit(RLIMIT_NPROC); tasks >= 0)
    limit = std::min(limit, std::max<int64_t>(tasks / kTasksPerInstance, 1));
  return limit;
}

std::string instanceLimitReason() {
  std::vector<std::string> parts{fmt::format("tessera's cap {}", kMaxInstances)};
  if (const int64_t files = softLimit(RLIMIT_NOFILE); files >= 0)
    parts.push_back(fmt::format("open files (ulimit -n) {} / {} per instance", files, kDescriptorsPerInstance));
  if (const int64_t tasks = softLimit(RLIMIT_NPROC); tasks >= 0)
    parts.push_back(fmt::format("processes (ulimit -u) {} / {} per instance", tasks, kTasksPerInstance));
  return fmt::format("the least of {}", fmt::join(parts, ", "));
}

void checkCounts(const LaunchArgs& args) {
  if (args.replicas < 1) {
    throw ConfigError(ErrorCode::OutOfRange, "--num-replicas",
                      fmt::format("{} replicas requested; at least 1 is needed", args.replicas));
  }
  if (args.instances < 1) {
    throw ConfigError(ErrorCode::OutOfRange, "--num-instances",
                      fmt::format("{} instances requested; at least 1 is needed", args.instances));
  }
  if (args.replicas % args.instances != 0) {
    throw ConfigError(
        ErrorCode::OutOfRange, "--num-replicas",
        fmt::format("{} replicas do not split evenly over {} instances (every instance runs the same "
                    "number); use a multiple of {}",
                    args.replicas, args.instances, args.instances));
  }
  if (args.ipusPerReplica < 1) {
    throw ConfigError(
        ErrorCode::OutOfRange, "--ipus-per-replica",
        fmt::format("{} processors per replica requested; at least 1 is needed", args.ipusPerReplica));
  }
  const int64_t limit = instanceLimit();
  if (args.instances > limit) {
    throw DistError(ErrorCode::TooManyInstances, "--num-instances",
                    fmt::format("{} instances requested; this machine lets mpirun start at most {} ({}); "
                                "use fewer instances, each with more replicas, or raise the limit",
                                args.instances, limit, instanceLimitReason()));
  }
}

// --timeout: a finite number of seconds above 0, up to the year
// TESSERA_DIST_TIMEOUT accepts.
double parseTimeout(const std::string& text) {
  constexpr double kMaxSeconds = 365.0 * 24 * 3600;
  double seconds = 0.0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, seconds);
  if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(seconds) || seconds <= 0.0 ||
      seconds > kMaxSeconds) {
    throw ConfigError(ErrorCode::InvalidOption, "--timeout",
                      fmt::format("\"{}\" is not a number of seconds in (0, {:g}]; leave it out for the "
                                  "default of {} s",
                                  boundedText(text), kMaxSeconds, dist::kDefaultTimeout.count()));
  }
  return seconds;
}

// The CPUs this process may run on, at least 1.
int64_t affinityCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(CPU_COUNT(&set), 1);
}

// Inside mpirun: this instance's variables, then COMMAND.
[[noreturn]] void runInstance(const LaunchArgs& args, const std::vector<std::string>& command) {
  const char* rank = std::getenv(std::string(dist::kMpiWorldRankVar).c_str());
  if (rank == nullptr) {
    throw DistError(ErrorCode::InconsistentDistEnv, std::string(dist::kMpiWorldRankVar),
                    "not set: --instance runs under mpirun only; use `tessera launch` without it");
  }
  const int64_t perInstance = args.replicas / args.instances;
  const char* localRank = std::getenv(std::string(dist::kMpiLocalRankVar).c_str());
  setVariable(dist::kNumTotalReplicasVar, std::to_string(args.replicas));
  setVariable(dist::kNumLocalReplicasVar, std::to_string(perInstance));
  setVariable(dist::kReplicaIndexOffsetVar, std::to_string(std::atoll(rank) * perInstance));
  setVariable(dist::kNumIpusPerReplicaVar, std::to_string(args.ipusPerReplica));
  setVariable(dist::kLocalInstanceIndexVar, localRank != nullptr ? std::string(localRank) : std::string("0"));
  setVariable("POPDIST_UNIFORM_REPLICAS_PER_INSTANCE", "1");
  if (args.timeoutSeconds > 0.0) setVariable(dist::kTimeoutVar, fmt::format("{}", args.timeoutSeconds));
  // The instances of one host share its CPUs: each device runs on its share
  // (DeviceSpec::numThreads), unless the user chose a count.
  if (std::getenv("TESSERA_NUM_THREADS") == nullptr) {
    const char* localSize = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const int64_t sharing =
        localSize != nullptr ? std::max<int64_t>(std::atoll(localSize), 1) : args.instances;
    setVariable("TESSERA_NUM_THREADS", std::to_string(std::max<int64_t>(affinityCpus() / sharing, 1)));
  }
  // The variables must describe what mpirun started.
  dist::readDistEnv();
  execute(command, "");
}

// This launch as the prefix of a command line (kLaunchCommandVar).
std::string launchCommand(const LaunchArgs& args) {
  std::string command = fmt::format("tessera launch --num-replicas {} --num-instances {}", args.replicas,
                                    args.instances);
  if (args.ipusPerReplica != 1) command += fmt::format(" --ipus-per-replica {}", args.ipusPerReplica);
  if (!args.timeoutText.empty()) command += " --timeout " + shellQuoted(args.timeoutText);
  if (!args.mpiArgs.empty()) command += " --mpi-args " + shellQuoted(args.mpiArgs);
  if (args.mpirun != "mpirun") command += " --mpirun " + shellQuoted(args.mpirun);
  return command + " --";
}

}  // namespace

Action attachLaunch(CLI::App& command) {
  auto args = std::make_shared<LaunchArgs>();
  command.add_option("--num-replicas", args->replicas, "Replicas of the whole run (default 1)");
  command.add_option(
      "--num-instances", args->instances,
      "Instances (processes) to start; each runs num-replicas / num-instances replicas (default 1)");
  command.add_option("--ipus-per-replica", args->ipusPerReplica,
                     "IPUs per replica (default 1): the run takes replicas x this many IPUs; more than 1 "
                     "needs /sessionOptions/virtualGraphMode Manual or Auto");
  command.add_option("--timeout", args->timeoutText,
                     "Seconds the instances have to start together, and that an instance waits for the others "
                     "in one exchange before it reports them lost (TESSERA_DIST_TIMEOUT; default 60); after a "
                     "stop signal, the time they have to stop before they are ended")
      ->type_name("SECONDS");
  command.add_option("--mpi-args", args->mpiArgs, "Options for mpirun, split at spaces, e.g. \"--host a,b\"")
      ->type_name("\"OPTION...\"");
  command.add_option("--mpirun", args->mpirun, "The mpirun program (default: mpirun from PATH)");
  command.add_flag("--instance", args->instance, "Run as one instance under mpirun (used by launch itself)")
      ->group("");
  command.add_option("COMMAND", args->command, "The program to run and its arguments, after --")->required();
  return [args]() -> int {
    const std::vector<std::string>& program = args->command;
    if (!args->timeoutText.empty()) args->timeoutSeconds = parseTimeout(args->timeoutText);
    checkCounts(*args);
    if (args->instance) runInstance(*args, program);
    if (args->instances > 1 && !dist::mpiAvailable()) {
      throw DistError(
          ErrorCode::MpiUnavailable, "--num-instances",
          fmt::format("{} instances requested but this build of tessera has no MPI support; install "
                      "libopenmpi-dev and rebuild, or use --num-instances 1",
                      args->instances));
    }
    std::vector<std::string> argv{args->mpirun, "-np", std::to_string(args->instances), "--oversubscribe"};
    if (::geteuid() == 0) argv.emplace_back("--allow-run-as-root");
    // Not pinned to one core each (mpirun's default for up to 2 processes):
    // every instance may use the host's CPUs and takes its share of them as
    // threads (runInstance).
    if (args->mpiArgs.find("--bind-to") == std::string::npos) argv.insert(argv.end(), {"--bind-to", "none"});
    // mpirun runs in a background process group (runMpirun): reading a
    // terminal there would stop it, so a terminal's input reaches no
    // instance. Input from a file or pipe still reaches instance 0.
    if (::isatty(STDIN_FILENO) != 0 && args->mpiArgs.find("-stdin") == std::string::npos)
      argv.insert(argv.end(), {"--stdin", "none"});
    for (std::string& option : words(args->mpiArgs)) argv.push_back(std::move(option));
    argv.push_back(std::filesystem::read_symlink("/proc/self/exe").string());
    argv.insert(argv.end(), {"launch", "--instance", "--num-replicas", std::to_string(args->replicas),
                             "--num-instances", std::to_string(args->instances), "--ipus-per-replica",
                             std::to_string(args->ipusPerReplica)});
    if (args->timeoutSeconds > 0.0)
      argv.insert(argv.end(), {"--timeout", fmt::format("{}", args->timeoutSeconds)});
    argv.emplace_back("--");
    argv.insert(argv.end(), program.begin(), program.end());
    setVariable(kLaunchCommandVar, launchCommand(*args));
    const double graceSeconds = args->timeoutSeconds > 0.0 ? args->timeoutSeconds
                                                           : static_cast<double>(dist::kDefaultTimeout.count());
    const StopGrace grace{std::chrono::milliseconds(std::llround(graceSeconds * 1000.0))};
    return runMpirun(argv, "; install openmpi-bin (scripts/setup.sh does) or name it with --mpirun", grace);
  };
}

}  // namespace tessera::cli
