// Running the built programs from tests: a temporary folder of the test's
// own, and a process runner that captures stdout, stderr and the exit code
// (arguments passed verbatim, no shell).
//
// TESSERA_CLI_WRAPPER, when set, is a command (words separated by spaces,
// the first found on PATH) that every program runs under, e.g. a memory
// checker:
//
//   TESSERA_CLI_WRAPPER="valgrind --error-exitcode=99 --leak-check=full -q"
//
// The wrapper reports a finding by exiting with kWrapperFindingExitCode, a
// code the programs never use (1 is the CLI's own "invalid input"), and
// runProgram fails the test with the wrapper's report then.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

extern char** environ;

namespace tessera::test {

// A folder of its own under the system's temporary folder, removed with
// everything in it when the test ends.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("tessera-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

  std::string write(const std::string& name, const std::string& content) const {
    const std::filesystem::path file = path_ / name;
    std::ofstream out(file, std::ios::binary);
    out << content;
    if (!out) throw std::runtime_error("cannot write " + file.string());
    return file.string();
  }

 private:
  std::filesystem::path path_;
};

inline std::string readFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

struct ProcessResult {
  int exitCode = -1;  // the negated signal number when it crashed
  std::string out;
  std::string err;
};

inline constexpr int kWrapperFindingExitCode = 99;

// The words of TESSERA_CLI_WRAPPER; empty when it is unset.
inline std::vector<std::string> wrapperCommand() {
  std::vector<std::string> words;
  const char* wrapper = std::getenv("TESSERA_CLI_WRAPPER");
  std::istringstream in(wrapper ? wrapper : "");
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

// Starts `program` with `args` under TESSERA_CLI_WRAPPER (if set), its
// standard streams as `actions` open them (which this destroys).
inline pid_t spawnProgram(const std::string& program, const std::vector<std::string>& args,
                          posix_spawn_file_actions_t& actions) {
  std::vector<std::string> argvStrings = wrapperCommand();
  const bool wrapped = !argvStrings.empty();
  argvStrings.push_back(program);
  argvStrings.insert(argvStrings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : argvStrings) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  // A wrapper is looked up on PATH; the program itself is a path.
  const int spawnError = wrapped ? posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ)
                                 : posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE_MESSAGE(spawnError == 0, "cannot start ", argv[0], ": ", std::strerror(spawnError));
  return pid;
}

// The wait status of a child once it has ended.
inline int waitStatus(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) REQUIRE(errno == EINTR);
  return status;
}

inline ProcessResult runProgram(const std::string& program, const std::vector<std::string>& args) {
  const TempDir dir;
  const std::string outPath = (dir.path() / "stdout").string();
  const std::string errPath = (dir.path() / "stderr").string();

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, outPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, errPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  const pid_t pid = spawnProgram(program, args, actions);
  const int status = waitStatus(pid);
  ProcessResult result;
  result.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  result.out = readFile(outPath);
  result.err = readFile(errPath);
  if (!wrapperCommand().empty() && result.exitCode == kWrapperFindingExitCode) {
    FAIL_CHECK("TESSERA_CLI_WRAPPER reported a finding in ", program, ":\n", result.err);
  }
  return result;
}

// The tessera program the CLI suites run (TESSERA_CLI, set by meson test).
inline std::string cliProgram() {
  const char* program = std::getenv("TESSERA_CLI");
  REQUIRE_MESSAGE(program != nullptr, "TESSERA_CLI must name the tessera program");
  return program;
}

inline ProcessResult runCli(const std::vector<std::string>& args) { return runProgram(cliProgram(), args); }

// How BackgroundProcess starts its program.
struct ProcessSetup {
  std::string workingDirectory;  // empty: the test's own
  // > 0: RLIMIT_FSIZE in bytes, with SIGXFSZ ignored so that a write past it
  // fails with EFBIG as on a full disk instead of killing the program.
  long long fileSizeLimit = 0;
  // > 0: the program runs as this user and group (the test must be root),
  // e.g. to meet permissions that root would bypass.
  uid_t user = 0;
  gid_t group = 0;
  // The program leads a process group of its own, as a shell's job does, so
  // that signalGroup reaches it and what it starts in that group.
  bool newProcessGroup = false;
};

// A program running in the background with its stdout and stderr in files of
// `dir`, so that a test can watch its progress and signal it. Killed when
// the object is destroyed. (Not run under TESSERA_CLI_WRAPPER: the tests that
// use it send signals to the program itself.)
class BackgroundProcess {
 public:
  BackgroundProcess(const std::filesystem::path& dir, const std::string& program,
                    const std::vector<std::string>& args, const ProcessSetup& setup = {})
      : out_((dir / "bg.out").string()), err_((dir / "bg.err").string()) {
    std::vector<std::string> strings{program};
    strings.insert(strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& arg : strings) argv.push_back(arg.data());
    argv.push_back(nullptr);
    const char* cwd = setup.workingDirectory.empty() ? nullptr : setup.workingDirectory.c_str();
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      // Only async-signal-safe calls between fork and exec.
      const int out = ::open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      const int err = ::open(err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (out < 0 || err < 0 || ::dup2(out, STDOUT_FILENO) < 0 || ::dup2(err, STDERR_FILENO) < 0)
        ::_exit(127);
      if (cwd != nullptr && ::chdir(cwd) != 0) ::_exit(127);
      if (setup.newProcessGroup && ::setpgid(0, 0) != 0) ::_exit(127);
      if (setup.user > 0 &&
          (::setgroups(0, nullptr) != 0 || ::setgid(setup.group) != 0 || ::setuid(setup.user) != 0))
        ::_exit(127);
      if (setup.fileSizeLimit > 0) {
        const rlimit limit{static_cast<rlim_t>(setup.fileSizeLimit),
                           static_cast<rlim_t>(setup.fileSizeLimit)};
        ::signal(SIGXFSZ, SIG_IGN);
        if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(127);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }
  ~BackgroundProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  BackgroundProcess(const BackgroundProcess&) = delete;
  BackgroundProcess& operator=(const BackgroundProcess&) = delete;

  pid_t pid() const { return pid_; }

  // Waits until stderr contains `text` `times` times; false after `seconds`
  // or when the program has ended without it.
  bool waitForError(const std::string& text, int seconds, int times = 1) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    const auto seen = [&] {
      const std::string err = readFile(err_);
      int found = 0;
      for (size_t at = err.find(text); at != std::string::npos; at = err.find(text, at + text.size()))
        ++found;
      return found >= times;
    };
    while (std::chrono::steady_clock::now() < deadline) {
      if (seen()) return true;
      siginfo_t info{};
      if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
          info.si_pid == pid_)
        return seen();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  void signal(int number) const { REQUIRE(::kill(pid_, number) == 0); }
  // The signal to the program's process group (ProcessSetup::newProcessGroup),
  // as a terminal sends Ctrl-C to its foreground job.
  void signalGroup(int number) const { REQUIRE(::kill(-pid_, number) == 0); }

  ProcessResult wait() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0) REQUIRE(errno == EINTR);
    pid_ = 0;
    ProcessResult result;
    result.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    result.out = readFile(out_);
    result.err = readFile(err_);
    return result;
  }

 private:
  std::string out_;
  std::string err_;
  pid_t pid_ = 0;
};

}  // namespace tessera::test
