// weft/prefix_store.h: a view of another Store whose keys all start with "<prefix>/".
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weft/store.h"

namespace weft {

// A PrefixStore namespaces another store: key "k" is stored as "<prefix>/k" in the underlying
// store (c10d's form, so weft and PyTorch PrefixStores over one TCPStore see the same keys).
// Sub-groups use it to share the world's store without colliding: PrefixStore("pg1", world)
// and PrefixStore("pg2", world) never see each other's keys. Prefixes nest:
// PrefixStore("b", PrefixStore("a", s)) stores "k" as "a/b/k". Queues are prefixed the same way.
//
// num_keys() is the underlying store's count, every prefix included, as in c10d: counting only
// this prefix's keys would need a key listing that the TCPStore protocol does not have.
// Errors come from the underlying store and name the full key ("a/k").
//
// Timeouts: a PrefixStore starts with its underlying store's timeout(); kDefaultTimeout in a call
// means this PrefixStore's timeout(), which is then passed down explicitly.
// Thread safety: as the underlying store; the PrefixStore itself holds no mutable state besides
// its timeout (set it before sharing the store between threads).
// Ownership: shares ownership of the underlying store.
class PrefixStore final : public Store {
 public:
  // Throws Error(InvalidArgument) when store is null.
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);
  ~PrefixStore() override;

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& underlying_store() const { return store_; }

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::chrono::milliseconds timeout = kDefaultTimeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            std::chrono::milliseconds timeout = kDefaultTimeout) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  void append(const std::string& key, const Bytes& value) override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys,
                               std::chrono::milliseconds timeout = kDefaultTimeout) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  void queue_push(const std::string& key, const Bytes& value) override;
  Bytes queue_pop(const std::string& key, bool block = true,
                  std::chrono::milliseconds timeout = kDefaultTimeout) override;
  int64_t queue_len(const std::string& key) override;
  std::string local_address() const override { return store_->local_address(); }

  using Store::set;

 private:
  std::string join(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> join(const std::vector<std::string>& keys) const;

  const std::string prefix_;
  const std::shared_ptr<Store> store_;
};

}  // namespace weft
