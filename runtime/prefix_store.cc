#include "weft/prefix_store.h"

#include <utility>

#include "weft/error.h"

namespace weft {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : prefix_(std::move(prefix)), store_(std::move(store)) {
  if (!store_) {
    throw_error(ErrorCode::InvalidArgument, "prefix store",
                "prefix \"" + prefix_ + "\" was given no underlying store");
  }
  set_timeout(store_->timeout());
}

PrefixStore::~PrefixStore() = default;

std::vector<std::string> PrefixStore::join(const std::vector<std::string>& keys) const {
  std::vector<std::string> joined;
  joined.reserve(keys.size());
  for (const auto& key : keys) joined.push_back(join(key));
  return joined;
}

void PrefixStore::set(const std::string& key, const Bytes& value) { store_->set(join(key), value); }

Bytes PrefixStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  return store_->get(join(key), resolve(timeout));
}

int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return store_->add(join(key), delta);
}

Bytes PrefixStore::compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) {
  return store_->compare_set(join(key), expected, desired);
}

bool PrefixStore::check(const std::vector<std::string>& keys) { return store_->check(join(keys)); }

void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  store_->wait(join(keys), resolve(timeout));
}

bool PrefixStore::delete_key(const std::string& key) { return store_->delete_key(join(key)); }

int64_t PrefixStore::num_keys() { return store_->num_keys(); }

void PrefixStore::append(const std::string& key, const Bytes& value) {
  store_->append(join(key), value);
}

std::vector<Bytes> PrefixStore::multi_get(const std::vector<std::string>& keys,
                                          std::chrono::milliseconds timeout) {
  return store_->multi_get(join(keys), resolve(timeout));
}

void PrefixStore::multi_set(const std::vector<std::string>& keys,
                            const std::vector<Bytes>& values) {
  store_->multi_set(join(keys), values);
}

void PrefixStore::queue_push(const std::string& key, const Bytes& value) {
  store_->queue_push(join(key), value);
}

Bytes PrefixStore::queue_pop(const std::string& key, bool block,
                             std::chrono::milliseconds timeout) {
  return store_->queue_pop(join(key), block, resolve(timeout));
}

int64_t PrefixStore::queue_len(const std::string& key) { return store_->queue_len(join(key)); }

}  // namespace weft
