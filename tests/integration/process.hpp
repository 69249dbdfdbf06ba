// SPDX-License-Identifier: MIT
// Child processes for multi-process tests: spawn with a pipe on stdout,
// wait for a readiness line, reap with a deadline (killed if late).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace averbs::test {

class child {
 public:
  /// Spawns `argv` (PATH searched) with stdout, and stderr too when
  /// `merge_stderr`, on a pipe this object reads.
  explicit child(const std::vector<std::string>& argv, bool merge_stderr = false) {
    if (argv.empty()) return;
    const std::string path = find_program(argv[0]);
    if (path.empty()) return;  // pid() < 0: not found
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      // Only async-signal-safe calls here (the test may have threads).
      // The child dies with the test process: a test that aborts (an
      // ASan report, std::terminate) must not leave peers bound to the
      // address and port the next run of the same test uses.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::dup2(fds[1], 1);
      if (merge_stderr) ::dup2(fds[1], 2);
      ::execve(path.c_str(), args.data(), environ);
      constexpr char failed[] = "child: execve failed\n";
      (void)!::write(2, failed, sizeof failed - 1);
      ::_exit(127);
    }
    ::close(fds[1]);
    if (pid_ < 0) {
      ::close(fds[0]);
      return;
    }
    out_ = fds[0];
  }
  ~child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) ::close(out_);
  }
  child(const child&) = delete;
  child& operator=(const child&) = delete;

  /// `name` as execvp would find it: itself if it holds a '/', else the
  /// first executable of that name on PATH ("" if none).
  static std::string find_program(const std::string& name) {
    if (name.find('/') != std::string::npos) return name;
    const char* env = std::getenv("PATH");
    std::string rest = env != nullptr ? env : "/usr/local/bin:/usr/bin:/bin";
    for (std::size_t at = 0; at <= rest.size();) {
      const std::size_t colon = std::min(rest.find(':', at), rest.size());
      std::string dir = rest.substr(at, colon - at);
      if (dir.empty()) dir = ".";
      const std::string candidate = dir + "/" + name;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
      at = colon + 1;
    }
    return {};
  }

  bool started() const { return pid_ > 0; }

  /// True while the process runs (reaps it once it has exited).
  bool running() {
    if (pid_ <= 0 || reaped_) return false;
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      reaped_ = true;
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      return false;
    }
    return true;
  }

  void signal(int sig) const {
    if (pid_ > 0 && !reaped_) ::kill(pid_, sig);
  }

  /// Reads stdout until a line equal to `line` (true) or EOF/deadline.
  bool wait_for_line(const std::string& line, std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      for (auto nl = buf_.find('\n'); nl != std::string::npos; nl = buf_.find('\n')) {
        const std::string l = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        output_ += l + "\n";
        if (l == line) return true;
      }
      if (!read_some(buf_, until)) return false;
    }
  }

  /// Reads stdout until it holds `text` anywhere (true) or EOF/deadline.
  bool wait_for_text(const std::string& text, std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    output_ += buf_;
    buf_.clear();
    while (output_.find(text) == std::string::npos)
      if (!read_some(output_, until)) return false;
    return true;
  }

  /// Reads what is there, waiting up to `wait` for something.
  void drain(std::chrono::milliseconds wait = std::chrono::milliseconds(0)) {
    output_ += buf_;  // a partial line wait_for_line left behind
    buf_.clear();
    pollfd p{out_, POLLIN, 0};
    int timeout = static_cast<int>(wait.count());
    while (out_ >= 0 && ::poll(&p, 1, timeout) == 1) {
      char b[4096];
      const ssize_t n = ::read(out_, b, sizeof b);
      if (n <= 0) break;
      output_.append(b, static_cast<std::size_t>(n));
      timeout = 0;
    }
  }

  /// Waits for exit; returns the exit status (128 + signal when killed by
  /// one), or -1 if it was killed at the deadline.
  int wait(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (running()) {
      drain(std::chrono::milliseconds(5));
      if (std::chrono::steady_clock::now() > until) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        reaped_ = true;
        status_ = -1;
      }
    }
    drain();
    return status_;
  }
  /// Everything read so far (lines `wait_for_line` consumed included).
  const std::string& output() const { return output_; }

 private:
  /// Waits until `until` for more output and appends it to `to`; false at
  /// EOF or the deadline.
  bool read_some(std::string& to, std::chrono::steady_clock::time_point until) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{out_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) != 1) return false;
    char b[256];
    const ssize_t n = ::read(out_, b, sizeof b);
    if (n <= 0) return false;
    to.append(b, static_cast<std::size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int out_ = -1;
  bool reaped_ = false;
  int status_ = -1;
  std::string buf_, output_;
};

/// Runs a shell command; true on exit status 0.  `out`, if given, gets
/// what it printed (its standard output and error), for a message.
inline bool sh(const std::string& cmd, std::string* out = nullptr) {
  if (out == nullptr) return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0;
  FILE* f = ::popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) return false;
  char b[256];
  std::size_t n;
  while ((n = std::fread(b, 1, sizeof b, f)) > 0) out->append(b, n);
  return ::pclose(f) == 0;
}

}  // namespace averbs::test
