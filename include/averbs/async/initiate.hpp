// SPDX-License-Identifier: MIT
/// @file
/// Internal: `detail::initiate<T>()`, the one template every `async_*`
/// operation calls.  It turns the caller's token into a delivery description
/// and a type-erased handler, then calls the operation's non-template body.
#pragma once

#include <averbs/async/completion_port.hpp>
#include <averbs/async/context.hpp>
#include <averbs/async/request.hpp>
#include <averbs/async/request_group.hpp>
#include <averbs/async/tokens.hpp>

#include <coroutine>
#include <future>
#include <memory>
#include <new>
#include <optional>
#include <type_traits>
#include <utility>

namespace averbs::detail {

/// Invokes or destroys a handler of type H stored inline in a slot.
template <class T, class H>
void inline_handler_thunk(handler_op op, void* storage, const std::error_code* ec, void* result) {
  H* h = std::launder(static_cast<H*>(storage));
  struct destroy_guard {
    H* h;
    ~destroy_guard() { h->~H(); }
  } guard{h};
  if (op != handler_op::invoke) return;
  if constexpr (std::is_void_v<T>) {
    std::move(*h)(*ec);
  } else {
    std::move(*h)(*ec, std::move(*static_cast<T*>(result)));
  }
}

/// Same, for a handler too large for the slot: the slot holds an owning
/// pointer (one allocation per operation, outside the no-allocation rule).
template <class T, class H>
void boxed_handler_thunk(handler_op op, void* storage, const std::error_code* ec, void* result) {
  std::unique_ptr<H> h(*std::launder(static_cast<H**>(storage)));
  if (op != handler_op::invoke) return;
  if constexpr (std::is_void_v<T>) {
    std::move(*h)(*ec);
  } else {
    std::move(*h)(*ec, std::move(*static_cast<T*>(result)));
  }
}

/// The error a future reports: std::system_error(ec), or, when the
/// completing thread cannot make that exception (out of memory), the
/// bad_alloc itself -- never a broken promise, which would lose the error.
template <class P>
void set_error(P& promise, const std::error_code& ec) noexcept {
  try {
    promise.set_exception(std::make_exception_ptr(std::system_error(ec)));
  } catch (...) {
    try {
      promise.set_exception(std::current_exception());
    } catch (...) {  // (only if already satisfied, which one completion cannot be)
    }
  }
}

template <class T>
struct promise_setter {
  std::promise<T> promise;
  void operator()(std::error_code ec) {
    if (ec)
      set_error(promise, ec);
    else promise.set_value();
  }
};

template <class T>
  requires(!std::is_void_v<T>)
struct promise_setter<T> {
  std::promise<T> promise;
  void operator()(std::error_code ec, T v) {
    if (ec)
      set_error(promise, ec);
    else promise.set_value(std::move(v));
  }
};

template <class T, class H>
void prepare_handler(initiation& in) {
  using D = std::decay_t<H>;
  if constexpr (sizeof(D) <= inline_handler_size && alignof(D) <= 16) {
    in.handler = &inline_handler_thunk<T, D>;
  } else {
    in.handler = &boxed_handler_thunk<T, D>;
  }
}

template <class H>
void construct_handler(void* storage, H&& h) {
  using D = std::decay_t<H>;
  if constexpr (sizeof(D) <= inline_handler_size && alignof(D) <= 16) {
    ::new (storage) D(std::forward<H>(h));
  } else {
    ::new (storage) D*(new D(std::forward<H>(h)));
  }
}

/// Starts an operation whose completion goes to a handler (thread or
/// immediate delivery).
template <class T, class Init, class H>
void start_with_handler(context& ctx, request_group* group, delivery_kind kind, H&& h, Init& init,
                        request_id* id_out = nullptr) {
  initiation in;
  in.kind = kind;
  in.result = result_manager<T>();
  in.result_type = result_type_of<T>();
  in.group = group != nullptr ? &group->detail_impl() : nullptr;
  prepare_handler<T, H>(in);
  context_impl& impl = ctx.detail_impl();
  const slot_ref s = begin_request(impl, in);
  try {
    construct_handler(s.handler_storage, std::forward<H>(h));
  } catch (...) {
    abandon_request(impl, s.id);
    throw;
  }
  if (id_out != nullptr) *id_out = s.id;
  init(completer<T>(impl, s.id));
  finish_initiation(impl, s.id, nullptr, nullptr);
}

/// The awaitable returned for `use_awaitable`: the operation starts when the
/// coroutine suspends on it, and the coroutine resumes in an alertable wait
/// of the same thread.  A coroutine frame destroyed while suspended on it
/// (a lazy task dropped) cancels the operation, and its completion resumes
/// nothing: the awaitable and the handler in the request's slot know each
/// other, and whichever goes first tells the other.
template <class T, class Init>
class awaitable_op {
 public:
  awaitable_op(context& ctx, request_group* group, Init init)
      : ctx_(&ctx), group_(group), init_(std::move(init)) {}
  awaitable_op(const awaitable_op&) = delete;
  awaitable_op& operator=(const awaitable_op&) = delete;
  ~awaitable_op() {
    if (handler_ == nullptr) return;  // not started, or resumed (or dropped)
    handler_->self = nullptr;         // a completion already queued resumes nothing
    handler_ = nullptr;
    // Through the context's core, which the request's slot keeps alive
    // (the public context may be gone: its shutdown queued the completion).
    (void)cancel_request(*impl_, id_);
  }

  bool await_ready() const noexcept { return false; }

  void await_suspend(std::coroutine_handle<> h) {
    impl_ = &ctx_->detail_impl();
    start_with_handler<T>(*ctx_, group_, delivery_kind::thread, resumer{this, h}, *init_, &id_);
    // The body has run: what it holds (a copy of the handle it works on)
    // goes now, not when the coroutine resumes.  Kept, it held a connector
    // or listener alive while the program dropped its last copy, which
    // must abort the wait (as for every other token).
    init_.reset();
  }

  T await_resume() {
    if (ec_) throw std::system_error(ec_);
    if constexpr (!std::is_void_v<T>) return std::move(*value_);
  }

 private:
  struct resumer {
    awaitable_op* self;
    std::coroutine_handle<> h;
    resumer(awaitable_op* s, std::coroutine_handle<> c) noexcept : self(s), h(c) {}
    // Each move tells the awaitable where the handler now lives (its last
    // home is the request's slot).
    resumer(resumer&& o) noexcept : self(std::exchange(o.self, nullptr)), h(o.h) {
      if (self != nullptr) self->handler_ = this;
    }
    resumer& operator=(resumer&&) = delete;
    ~resumer() {
      if (self != nullptr && self->handler_ == this) self->handler_ = nullptr;  // dropped unrun
    }
    void operator()(std::error_code ec) {
      if (awaitable_op* a = release()) {
        a->ec_ = ec;
        h.resume();
      }
    }
    template <class U = T>
      requires(!std::is_void_v<U>)
    void operator()(std::error_code ec, U v) {
        if (awaitable_op* a = release()) {
          a->ec_ = ec;
          a->value_.emplace(std::move(v));
          h.resume();
        }
      }
      // The awaitable, now done with this handler (it may be destroyed
      // during the resumption); null if its frame is gone.
      awaitable_op* release() noexcept {
        awaitable_op* a = std::exchange(self, nullptr);
        if (a != nullptr) a->handler_ = nullptr;
        return a;
      }
  };

  context* ctx_;
  request_group* group_;
  std::optional<Init> init_;
  resumer* handler_ = nullptr;  // the started operation's handler, until it runs
  context_impl* impl_ = nullptr;
  request_id id_{};
  std::error_code ec_;
  std::optional<std::conditional_t<std::is_void_v<T>, char, T>> value_;
};

/// Starts an operation with result type T, delivering its completion as
/// `token` asks.  `init(completer<T>)` is the operation's body: it must not
/// throw and must not invoke anything of the caller's.  For `use_awaitable`
/// the body is stored and called later, so it must capture by value.
template <class T, class Token, class Init>
  requires completion_token<Token, T> && std::is_nothrow_invocable_v<Init&, completer<T>>
auto initiate(context& ctx, request_group* group, Token&& token, Init&& init) {
  using D = std::decay_t<Token>;
  context_impl& impl = ctx.detail_impl();
  if constexpr (std::same_as<D, use_awaitable_t>) {
    return awaitable_op<T, std::decay_t<Init>>(ctx, group, std::forward<Init>(init));
  } else if constexpr (std::same_as<D, use_future_t>) {
    promise_setter<T> setter;
    std::future<T> f = setter.promise.get_future();
    start_with_handler<T>(ctx, group, delivery_kind::immediate, std::move(setter), init);
    return f;
  } else if constexpr (std::same_as<D, use_request_t> || std::same_as<D, port_binding>) {
    initiation in;
    in.result = result_manager<T>();
    in.result_type = result_type_of<T>();
    in.group = group != nullptr ? &group->detail_impl() : nullptr;
    if constexpr (std::same_as<D, use_request_t>) {
      in.kind = delivery_kind::request;
      const slot_ref s = begin_request(impl, in);
      init(completer<T>(impl, s.id));
      finish_initiation(impl, s.id, nullptr, nullptr);
      return request<T>(ctx, s.id);
    } else {
      in.kind = delivery_kind::port;
      in.port = &token.port->detail_impl();
      in.key = token.key;
      in.skip_port_on_inline_success = token.flags == port_flags::skip_on_inline_success;
      const slot_ref s = begin_request(impl, in);
      init(completer<T>(impl, s.id));
      port_submission<T> r;
      if constexpr (std::is_void_v<T>) {
        r.inline_ = finish_initiation(impl, s.id, nullptr, nullptr);
      } else {
        alignas(T) unsigned char buf[sizeof(T)];
        r.inline_ = finish_initiation(impl, s.id, buf, nullptr);
        if (r.inline_) {
          T* p = std::launder(reinterpret_cast<T*>(buf));
          r.value_ = std::move(*p);
          p->~T();
        }
      }
      return r;
    }
  } else {
    start_with_handler<T>(ctx, group, delivery_kind::thread, std::forward<Token>(token), init);
  }
}

/// The synchronous twin of an operation: fails at once with
/// `errc::would_deadlock` inside a handler, else starts the operation with
/// `use_request` and waits for it.
template <class T, class Start>
T sync_call(Start&& start, std::error_code& ec) noexcept {
  if (in_handler()) {
    ec = make_error_code(errc::would_deadlock);
    if constexpr (!std::is_void_v<T>) return T{};
    else return;
  }
  try {
    // Starting can fail before any request exists (an empty handle, a full
    // slab): that error is this call's result.
    return start(use_request).get(ec);
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (...) {
    ec = make_error_code(errc::no_resources);
  }
  if constexpr (!std::is_void_v<T>) return T{};
}

template <class T, class Start>
T sync_call(Start&& start, const char* what) {
  std::error_code ec;
  if constexpr (std::is_void_v<T>) {
    sync_call<T>(std::forward<Start>(start), ec);
    if (ec) throw_error(ec, what);
  } else {
    T v = sync_call<T>(std::forward<Start>(start), ec);
    if (ec) throw_error(ec, what);
    return v;
  }
}

}  // namespace averbs::detail
