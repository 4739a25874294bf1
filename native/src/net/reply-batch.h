// ReplyBatch: replies finished together on one thread go out together.
//
// A connection loop that reads several replica answers in one turn finishes several NBD
// requests at once (RemoteReplica::OnLoop), and each would send its own reply: one sendmsg
// per reply. While a ReplyBatch is open on a thread, a sender that takes part
// (NbdConnection::SendReply) queues its reply and registers itself once (Defer); closing
// the batch has every registered sender send what it queued, one sendmsg for all of it.
//
// A registered sender must stay alive until SendBatched (NbdConnection counts itself busy
// meanwhile). Batches do not nest: one opened inside another is inert. SendBatched must not
// throw.
#pragma once

#include <cstddef>

namespace mooring {

class ReplyBatch {
 public:
  struct Sender {
    virtual void SendBatched() noexcept = 0;

   protected:
    ~Sender() = default;
  };

  ReplyBatch() {
    if (current_ == nullptr) current_ = this;
  }
  ~ReplyBatch() {
    if (current_ != this) return;
    current_ = nullptr;  // a sender's flush sends now, never into this batch
    for (size_t i = 0; i < n_; ++i) senders_[i]->SendBatched();
  }
  ReplyBatch(const ReplyBatch&) = delete;
  ReplyBatch& operator=(const ReplyBatch&) = delete;

  // With a batch open on this thread and room in it: remembers s, whose SendBatched runs
  // when the batch closes, and returns true. Else false: s sends now.
  static bool Defer(Sender* s) {
    ReplyBatch* b = current_;
    if (b == nullptr || b->n_ == kMaxSenders) return false;
    b->senders_[b->n_++] = s;
    return true;
  }

 private:
  static constexpr size_t kMaxSenders = 16;
  static inline thread_local ReplyBatch* current_ = nullptr;
  Sender* senders_[kMaxSenders];
  size_t n_ = 0;
};

}  // namespace mooring
