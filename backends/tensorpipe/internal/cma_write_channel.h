// A TensorPipe channel for CPU tensors between processes of one machine in
// which the sender writes into the receiver's memory (internal to the
// tensorpipe backend; docs/decisions.md, "A channel in which the sender
// writes").
//
// TensorPipe's own `cma` channel has the receiver read the sender's memory
// with process_vm_readv(), and the kernel pins the sender's pages first,
// one by one: from a tensor of LibTorch's on 4 KiB pages that runs at 0.45x
// of memcpy on the project's machine. Here the sender writes with
// process_vm_writev(), and the pages pinned are the receiver's: tether's
// receive buffers, on huge pages from 2 MiB. The copy runs at memcpy's
// speed whatever memory the user's tensor is on (docs/benchmarks.md, "64
// MiB: who copies").
//
// The protocol, on the channel's one connection. TensorPipe matches the
// sends and recvs of a channel by their order; each side numbers them.
//   - The receiver, once it knows where the tensor goes (its recv), sends a
//     grant: the number, its pid, the address and the length.
//   - The sender, holding the send of that number, checks the length,
//     writes with process_vm_writev() on the context's copy thread, and
//     answers with a done note: 0, or the errno of the write. Its send is
//     complete when the write returned.
//   - The receiver's recv is complete on the done note.
// Every note is kCmaWriteNoteBytes long. A note out of order or of a kind
// or length not expected fails the channel (and so the pipe), saying what
// was wrong.
//
// A receive that fails after its grant (the channel closed, the peer gone)
// cannot know whether the write is still to come. Whoever hands the channel
// its receive buffers must therefore use buffers of
// core/toolkit/receive_buffers.h's writable_receive_storage() and
// quarantine those of a failed read (quarantine_receive_storage()): the
// tensorpipe backend's framing does (IncomingFrame::quarantine). A send
// whose write is under way completes only when the write returned, so the
// sender's memory stays its own until then.
//
// Viability is TensorPipe's `cma` channel's (the same machine, user and
// namespaces, and ptrace allowed by the kernel's policy), and so is the
// device descriptor: two contexts agree exactly where `cma` would. The
// trust between the processes is the one `cma` needs: either could read
// or write the other's memory anyway.
//
// Thread safety: as every TensorPipe channel context.
#ifndef TETHER_BACKENDS_TENSORPIPE_INTERNAL_CMA_WRITE_CHANNEL_H_
#define TETHER_BACKENDS_TENSORPIPE_INTERNAL_CMA_WRITE_CHANNEL_H_

#include <tensorpipe/channel/context.h>

#include <cstddef>
#include <memory>

namespace tether::backends::tensorpipe::internal {

// Bytes of every note of the channel's protocol.
inline constexpr size_t kCmaWriteNoteBytes = 32;

// The context; not viable (isViable() false) where TensorPipe's `cma`
// channel is not.
std::shared_ptr<::tensorpipe::channel::Context> create_cma_write_channel();

}  // namespace tether::backends::tensorpipe::internal

#endif  // TETHER_BACKENDS_TENSORPIPE_INTERNAL_CMA_WRITE_CHANNEL_H_
