// The runtime's fork steps (pthread_atfork): every lock the shim holds is either held by the
// forking thread across fork() — so the child finds each table whole and re-initialises the
// lock, which no thread of the child can hold — or its state is dropped in the child.
//
// Locks are taken outermost first, in the order the shim's own code nests them (a thread
// holding a lock only ever waits for one later in this list), so `before_fork` cannot
// deadlock against a thread in the middle of a hook:
//
//   build_mutex_          building the layout, recorder, injector (→ layout, injector)
//   ipc_.mutex            CUDA IPC tables (→ thawd client, notices)
//   layout mutex          DeterministicLayout (→ recorder as its observer, injector as its
//                         page backing)
//   recorder mutex        LayoutRecorder (→ thawd client, notices)
//   engine memory         leaf
//   KV restore            leaf (KvRestore calls the driver and thawd without its lock)
//   managed-file table    leaf
//   file mappings         leaf
//   graph recorder        leaf (it calls the driver and says things outside its lock)
//   graph restore worker  leaf (the lock that wakes the worker; taken under the recorder's)
//   userfaultfd registry  leaf (its open lock, then its table)
//   notices               leaf, last: said from under most of the above
//
// Not held, and why that is safe:
//   injector mutex        the injector is the parent's (its slot, its importer thread): the
//                         child drops it, unreachable, with the grant not yet used; the
//                         layout forgets it as page backing.
//   thawd client          the child closes its copy of the parent's connection and resets
//                         every field the connection's lock guards (daemon_after_fork_in_child):
//                         nothing the lock protected survives to be inconsistent.
//   hook table, driver    atomics only.
// The graph restore's worker thread is not in the child (reset_after_fork forgets it and what
// it pre-built); in the parent it waits for the graph restore's lock, held across fork().
#include "preload/files/streaming_mapping.hpp"
#include "preload/runtime/shim_runtime.hpp"
#include "preload/thawd_client/thawd_client.hpp"

namespace thaw::preload {

namespace {

// The child's copy of a lock the forking thread held: no thread of the child holds it.
template <typename Lock>
void reinitialise(Lock& lock) {
  new (&lock) Lock();
}

}  // namespace

void ShimRuntime::before_fork() {
  ReentryGuard guard;  // what the fork steps call (close, the driver) is the shim's own
  graph_restore_.fork_mutex().lock();  // first: it is held while the layout's locks are taken
  build_mutex_.lock();
  ipc_.mutex.lock();
  if (DeterministicLayout* l = layout_.load()) l->fork_mutex().lock();
  if (LayoutRecorder* r = recorder_.load()) r->fork_mutex().lock();
  engine_memory_.fork_mutex().lock();
  kv_restore_.fork_mutex().lock();
  files_.fork_mutex().lock();
  file_mappings_.fork_mutex().lock();
  if (GraphRecorder* g = graph_recorder_.load()) g->fork_mutex().lock();
  graph_restore_.worker_fork_mutex().lock();
  streaming_before_fork();
  notices_before_fork();
}

void ShimRuntime::after_fork_in_parent() {
  ReentryGuard guard;
  notices_after_fork_in_parent();
  streaming_after_fork_in_parent();
  graph_restore_.worker_fork_mutex().unlock();
  if (GraphRecorder* g = graph_recorder_.load()) g->fork_mutex().unlock();
  file_mappings_.fork_mutex().unlock();
  files_.fork_mutex().unlock();
  kv_restore_.fork_mutex().unlock();
  engine_memory_.fork_mutex().unlock();
  if (LayoutRecorder* r = recorder_.load()) r->fork_mutex().unlock();
  if (DeterministicLayout* l = layout_.load()) l->fork_mutex().unlock();
  ipc_.mutex.unlock();
  build_mutex_.unlock();
  graph_restore_.fork_mutex().unlock();
}

void ShimRuntime::after_fork_in_child() {
  ReentryGuard guard;
  // First every lock, so that what follows may take any of them.
  notices_after_fork_in_child();
  reinitialise(file_mappings_.fork_mutex());
  reinitialise(files_.fork_mutex());
  reinitialise(engine_memory_.fork_mutex());
  kv_restore_.reset_after_fork();     // re-initialises its lock; the parent's lookup is not ours
  graph_restore_.reset_after_fork();  // likewise (both its locks); no worker, no handles
  reinitialise(ipc_.mutex);
  reinitialise(build_mutex_);
  // The child is a run of its own: the recorder starts afresh (keeping the model opened
  // before the fork), and a layout the parent used stops (its driver state is the parent's).
  // Both re-initialise their own locks.
  if (LayoutRecorder* r = recorder_.load()) r->reset_after_fork();
  if (DeterministicLayout* l = layout_.load()) l->reset_after_fork();
  // The parent's graphs and module handles are the parent's driver state.
  if (GraphRecorder* g = graph_recorder_.load()) g->reset_after_fork();
  // A slot attachment is the parent's: thawd counts its pages as the parent's, and only the
  // parent releases it. The child neither injects from it nor gives it back at exit.
  if (injector_.exchange(nullptr) != nullptr) {
    if (DeterministicLayout* l = layout_.load()) l->set_backing(nullptr);
  }
  (void)pending_grant_.release();  // its descriptors stay open, unused, in the child
  grant_pending_.store(false, std::memory_order_release);
  streaming_after_fork_in_child();
  daemon_after_fork_in_child();
}

}  // namespace thaw::preload
