// SPDX-License-Identifier: MIT
/// @file
/// Internal boundary between the completion-token templates and the
/// non-template request core.  Not part of the documented API: include
/// `<averbs/async.hpp>` instead.
///
/// Implementation overview
/// -----------------------
/// Every asynchronous operation owns one *slot* in its context's slab from
/// initiation until its completion has been delivered.  A slot is addressed by
/// `request_id` = (index, generation); the generation changes every time the
/// slot is freed, so a completion or cancel that names a finished request is
/// detected and ignored instead of touching the new occupant.
///
/// The token templates do three things only: describe the delivery (an
/// `initiation`), construct the caller's handler into the slot's inline
/// storage, and call the operation's non-template body with a `completer`.
/// Result values and handlers are type-erased by two function pointers
/// (`result_manage_fn`, `handler_fn`) instead of vtable objects, so a module
/// that instantiates them owns no unique symbols and can still be unloaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <system_error>
#include <type_traits>
#include <typeinfo>
#include <utility>

namespace averbs::detail {

class context_impl;
class port_impl;
class group_impl;

/// Results up to this size live inside the slot (no allocation).
inline constexpr std::size_t inline_result_size = 256;
/// Handlers up to this size live inside the slot; larger ones are boxed.
inline constexpr std::size_t inline_handler_size = 96;

/// A request's address: slot index plus the slot's generation.
struct request_id {
  std::uint32_t index = 0;
  std::uint32_t generation = 0;

  friend bool operator==(request_id, request_id) = default;
  std::uint64_t packed() const noexcept {
    return (std::uint64_t{generation} << 32) | index;
  }
  static request_id unpack(std::uint64_t v) noexcept {
    return {static_cast<std::uint32_t>(v), static_cast<std::uint32_t>(v >> 32)};
  }
};

enum class result_op : std::uint8_t { move_construct, destroy, default_construct };
/// Moves, destroys or default-constructs a result value of one type.
using result_manage_fn = void (*)(result_op op, void* dst, void* src) noexcept;

template <class T>
void manage_result(result_op op, void* dst, void* src) noexcept {
  static_assert(sizeof(T) <= inline_result_size && alignof(T) <= 16,
                "operation results must fit the slot's inline storage");
  static_assert(std::is_nothrow_move_constructible_v<T>);
  switch (op) {
    case result_op::move_construct:
      ::new (dst) T(std::move(*static_cast<T*>(src)));
      break;
    case result_op::destroy:
      static_cast<T*>(dst)->~T();
      break;
    case result_op::default_construct:
      ::new (dst) T();
      break;
  }
}

enum class handler_op : std::uint8_t { invoke, destroy };
/// Invokes (then destroys) or only destroys a type-erased handler.  `invoke`
/// moves the result out of `result` (may be null for void operations).  The
/// handler is destroyed even if invoking it throws.
using handler_fn = void (*)(handler_op op, void* storage, const std::error_code* ec,
                            void* result);

/// How a completed request reaches its caller.
enum class delivery_kind : std::uint8_t {
  request,    ///< a `request<T>` handle (also the synchronous calls)
  port,       ///< a `completion_port` entry
  thread,     ///< a handler run on the initiating thread in an alertable wait
  immediate,  ///< internal sink run by the completing thread (futures)
};

/// What a completion token asks of the core.
struct initiation {
  delivery_kind kind = delivery_kind::request;
  bool skip_port_on_inline_success = false;
  result_manage_fn result = nullptr;  ///< null for void operations
  const std::type_info* result_type = nullptr;
  handler_fn handler = nullptr;       ///< thread and immediate kinds
  port_impl* port = nullptr;
  std::uint64_t key = 0;
  group_impl* group = nullptr;
};

struct slot_ref {
  request_id id;
  void* handler_storage;  ///< `inline_handler_size` bytes, 16-aligned
};

/// Allocates a slot for a new request.  Never blocks; allocates memory only
/// when the slab must grow (warm-up).  Takes a reference on the module that
/// contains `init.handler`, if that module was loaded with dlopen.
slot_ref begin_request(context_impl& ctx, const initiation& init);

/// Frees a slot whose initiation failed before the operation started (the
/// handler could not be constructed).  No completion is delivered.
void abandon_request(context_impl& ctx, request_id id) noexcept;

/// Ends the initiation phase; delivers a completion that happened inline.
/// Returns true if the request completed inline with success and the caller
/// asked to skip the port: then the result has been moved into `result_out`
/// (if non-null) and the slot is already free.
bool finish_initiation(context_impl& ctx, request_id id, void* result_out,
                       std::error_code* ec_out) noexcept;

/// Completes a request.  `result` is moved from (may be null for void
/// operations).  Returns false, and counts it, if the request already
/// completed or the id is stale.
bool complete_request(context_impl& ctx, request_id id, const std::error_code& ec,
                      void* result) noexcept;

/// Registers a function the core calls when the request is cancelled, so
/// the operation can drop its own reference to the request.  Called at most
/// once, never after the operation completed the request.  Only during the
/// request's initiation (the operation's body): its slot cannot be freed
/// then.  Later, the check that the request is still pending and the store
/// are not one step, and the hook could land on a reused slot.
using cancel_fn = void (*)(void* arg, request_id id) noexcept;
void set_cancel_hook(context_impl& ctx, request_id id, cancel_fn fn, void* arg) noexcept;

/// True while the request is pending (neither completed nor freed).
bool request_pending(context_impl& ctx, request_id id) noexcept;

/// Pending, and someone still wants its result: a `use_request` request
/// whose handle was dropped is pending but wanted by nobody (what it would
/// deliver, a connection say, would be thrown away).
bool request_wanted(context_impl& ctx, request_id id) noexcept;

/// Completes a pending request with `errc::operation_aborted`.
bool cancel_request(context_impl& ctx, request_id id) noexcept;

/// True while the calling thread runs a completion handler.
bool in_handler() noexcept;

/// Gives back a module reference (module_ref.cpp): a completion entry's.
void module_release(void* handle) noexcept;

void context_add_ref(context_impl& ctx) noexcept;
void context_release(context_impl& ctx) noexcept;

/// The typed side of completing one request; handed to operation bodies.
/// Copyable and trivially cheap; completing twice is detected by the core.
template <class T>
class completer {
 public:
  completer() = default;
  completer(context_impl& ctx, request_id id) noexcept : ctx_(&ctx), id_(id) {}

  context_impl& context() const noexcept { return *ctx_; }
  request_id id() const noexcept { return id_; }

  template <class U = T>
    requires(!std::is_void_v<U>)
  bool complete(const std::error_code& ec, U value) const noexcept {
    return complete_request(*ctx_, id_, ec, &value);
  }
  template <class U = T>
    requires(std::is_void_v<U>)
  bool complete(const std::error_code& ec) const noexcept {
    return complete_request(*ctx_, id_, ec, nullptr);
  }
  /// Completes with an error; the caller of a non-void operation receives a
  /// default-constructed value.
  bool fail(const std::error_code& ec) const noexcept {
    return complete_request(*ctx_, id_, ec, nullptr);
  }
  void on_cancel(cancel_fn fn, void* arg) const noexcept {
    set_cancel_hook(*ctx_, id_, fn, arg);
  }

 private:
  context_impl* ctx_ = nullptr;
  request_id id_{};
};

template <class T>
constexpr result_manage_fn result_manager() noexcept {
  if constexpr (std::is_void_v<T>) {
    return nullptr;
  } else {
    return &manage_result<T>;
  }
}

template <class T>
const std::type_info* result_type_of() noexcept {
  if constexpr (std::is_void_v<T>) {
    return nullptr;
  } else {
    return &typeid(T);
  }
}

}  // namespace averbs::detail
