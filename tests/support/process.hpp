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
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>
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

inline ProcessResult runProgram(const std::string& program, const std::vector<std::string>& args) {
  const TempDir dir;
  const std::string outPath = (dir.path() / "stdout").string();
  const std::string errPath = (dir.path() / "stderr").string();

  std::vector<std::string> argvStrings = wrapperCommand();
  const bool wrapped = !argvStrings.empty();
  argvStrings.push_back(program);
  argvStrings.insert(argvStrings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : argvStrings) argv.push_back(arg.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, outPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, errPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid = 0;
  // A wrapper is looked up on PATH; the program itself is a path.
  const int spawnError = wrapped ? posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ)
                                 : posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE_MESSAGE(spawnError == 0, "cannot start ", argv[0], ": ", std::strerror(spawnError));

  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) REQUIRE(errno == EINTR);
  ProcessResult result;
  result.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  result.out = readFile(outPath);
  result.err = readFile(errPath);
  if (wrapped && result.exitCode == kWrapperFindingExitCode) {
    FAIL_CHECK("TESSERA_CLI_WRAPPER reported a finding in ", program, ":\n", result.err);
  }
  return result;
}

}  // namespace tessera::test
