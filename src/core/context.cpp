// SPDX-License-Identifier: MIT
// The public faces of the context and of requests, over context_impl.
#include "core/context_impl.hpp"

#include <averbs/async/context.hpp>
#include <averbs/async/request.hpp>
#include <averbs/error.hpp>

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

namespace averbs {
namespace detail {

slot_ref begin_request(context_impl& ctx, const initiation& init) { return ctx.begin(init); }

bool finish_initiation(context_impl& ctx, request_id id, void* result_out,
                       std::error_code* ec_out) noexcept {
  return ctx.finish(id, result_out, ec_out);
}

void abandon_request(context_impl& ctx, request_id id) noexcept { ctx.abandon(id); }

bool complete_request(context_impl& ctx, request_id id, const std::error_code& ec,
                      void* result) noexcept {
  return ctx.complete(id, ec, result, false);
}

bool request_pending(context_impl& ctx, request_id id) noexcept {
  slot* s = ctx.lookup(id.index);
  if (s == nullptr) return false;
  const std::uint64_t w = s->word.load(std::memory_order_acquire);
  return gen_of(w) == id.generation && state_of(w) == state_pending;
}

bool request_wanted(context_impl& ctx, request_id id) noexcept {
  slot* s = ctx.lookup(id.index);
  if (s == nullptr) return false;
  const std::uint64_t w = s->word.load(std::memory_order_acquire);
  return gen_of(w) == id.generation && state_of(w) == state_pending && (w & flag_orphaned) == 0;
}

bool cancel_request(context_impl& ctx, request_id id) noexcept {
  return ctx.complete(id, make_error_code(errc::operation_aborted), nullptr, true);
}

void set_cancel_hook(context_impl& ctx, request_id id, cancel_fn fn, void* arg) noexcept {
  slot* s = ctx.lookup(id.index);
  if (s == nullptr) return;
  // Only on the request itself, still pending: a completer that sets its
  // hook after the request completed and its slot went to another one
  // must not hang its hook there.  (Inside the initiation the slot cannot
  // be freed: the initiator delivers.)
  const std::uint64_t w = s->word.load(std::memory_order_acquire);
  if (gen_of(w) != id.generation || state_of(w) != state_pending) return;
  s->cancel_arg.store(arg, std::memory_order_relaxed);
  s->cancel_hook.store(fn, std::memory_order_release);
}

void context_add_ref(context_impl& ctx) noexcept { ctx.add_ref(); }
void context_release(context_impl& ctx) noexcept { ctx.release(); }

bool request_ready(context_impl& ctx, request_id id) noexcept {
  return state_of(ctx.at(id.index).word.load(std::memory_order_acquire)) == state_completed;
}

std::error_code request_wait(context_impl& ctx, request_id id, std::chrono::nanoseconds timeout,
                             bool alertable) {
  slot& s = ctx.at(id.index);
  if (state_of(s.word.load(std::memory_order_acquire)) == state_completed) return {};
  if (timeout > std::chrono::nanoseconds::zero() && in_handler())
    return make_error_code(errc::would_deadlock);
  // Not before a completer that saw this thread waiting has finished
  // waking it: after a wait that timed out as the request completed, and
  // after a handler that threw (the thread may end, and its state with it).
  struct delivered_guard {
    slot& s;
    ~delivered_guard() { wait_delivered(s.word); }
  } guard{s};
  request_waiter w(s, id);
  return ctx.wait(w, timeout, alertable);
}

std::error_code request_take(context_impl& ctx, request_id id, void* out) noexcept {
  slot& s = ctx.at(id.index);
  const std::error_code ec = s.ec;
  if (out != nullptr && s.has_result) {
    s.manage(result_op::move_construct, out, s.result);
  } else if (out != nullptr) {
    s.manage(result_op::default_construct, out, nullptr);
  }
  ctx.free_slot(id.index);
  return ec;
}

void request_release(context_impl& ctx, request_id id) noexcept {
  slot& s = ctx.at(id.index);
  std::uint64_t w = s.word.load(std::memory_order_acquire);
  for (;;) {
    if (state_of(w) == state_completed) {
      ctx.free_slot(id.index);
      return;
    }
    // Pending or completing: the completer frees the slot when it sees this.
    if (s.word.compare_exchange_weak(w, w | flag_orphaned, std::memory_order_acq_rel,
                                     std::memory_order_acquire))
      return;
  }
}

int request_native_handle(context_impl& ctx, request_id id, std::error_code& ec) noexcept {
  slot& s = ctx.at(id.index);
  if (s.event_fd < 0) {
    s.event_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s.event_fd < 0) {
      ec.assign(errno, std::system_category());
      return -1;
    }
  }
  ec.clear();
  std::uint64_t w = s.word.load(std::memory_order_acquire);
  for (;;) {
    if ((w & flag_fd_armed) != 0) return s.event_fd;
    if (state_of(w) == state_completed) {
      if (!s.fd_signaled) {
        s.fd_signaled = true;
        const std::uint64_t one = 1;
        while (::write(s.event_fd, &one, sizeof one) < 0 && errno == EINTR) {
        }
      }
      return s.event_fd;
    }
    if (s.word.compare_exchange_weak(w, w | flag_fd_armed, std::memory_order_acq_rel,
                                     std::memory_order_acquire))
      return s.event_fd;
  }
}

}  // namespace detail

// ---------------------------------------------------------------------------

context::context(const context_options& opts) : impl_(new detail::context_impl(opts)) {}

context::~context() {
  impl_->shutdown();
  impl_->release();
}

void context::add_source(progress_source& s) {
  std::error_code ec;
  add_source(s, ec);
  if (ec) throw_error(ec, "averbs::context::add_source");
}

void context::add_source(progress_source& s, std::error_code& ec) noexcept { impl_->add_source(s, ec); }

void context::remove_source(progress_source& s) noexcept { impl_->remove_source(s); }

std::size_t context::poll() noexcept { return impl_->poll(); }

namespace {
class never final : public detail::wait_target {
 public:
  bool ready() noexcept override { return false; }
  bool arm(detail::thread_state&) noexcept override { return true; }
  void disarm() noexcept override {}
};
}  // namespace

std::size_t context::alertable_wait(std::chrono::nanoseconds timeout, std::error_code& ec) {
  ec.clear();
  detail::thread_state* const ts = detail::thread_state::try_current(ec);
  if (ts == nullptr) return 0;
  // The rule first: inside a handler a waiting call fails at once, even
  // when handlers are queued (running them here would nest them).
  if (timeout > std::chrono::nanoseconds::zero() && detail::in_handler()) {
    ec = make_error_code(errc::would_deadlock);
    return 0;
  }
  if (ts->has_work()) return ts->run();
  never target;
  std::size_t ran = 0;
  const std::error_code wec = impl_->wait(target, timeout, true, &ran);
  if (wec == errc::alerted) return ran;
  ec = wec;
  return 0;
}

std::size_t context::alertable_wait(std::chrono::nanoseconds timeout) {
  std::error_code ec;
  const std::size_t n = alertable_wait(timeout, ec);
  if (ec && ec != errc::timed_out) throw_error(ec, "averbs::context::alertable_wait");
  return n;
}

int context::native_handle() const noexcept { return impl_->epoll_fd(); }

int context::thread_handle() const { return detail::thread_state::current().handle_fd(); }

averbs::clock& context::clock() const noexcept { return impl_->clock(); }

void context::start_progress_thread() { impl_->start_progress_thread(); }

void context::stop_progress_thread() noexcept { impl_->stop_progress_thread(); }

context_stats context::stats() const noexcept { return impl_->stats(); }

}  // namespace averbs
