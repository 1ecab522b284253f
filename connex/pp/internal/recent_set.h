// RecentSet: the last `capacity` distinct keys inserted, with O(log n) lookup; the oldest is
// forgotten first. For "have I seen this correlation id / this gone owner" questions whose
// memory must stay bounded. Thread-compatible.
#ifndef CONNEX_PP_INTERNAL_RECENT_SET_H_
#define CONNEX_PP_INTERNAL_RECENT_SET_H_

#include <cstddef>
#include <deque>
#include <map>
#include <set>

namespace connex::pp::internal {

template <typename Key>
class RecentSet {
 public:
  explicit RecentSet(size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

  // True when `key` was new.
  bool Insert(const Key& key) {
    if (!keys_.insert(key).second) return false;
    order_.push_back(key);
    while (order_.size() > capacity_) {
      keys_.erase(order_.front());
      order_.pop_front();
    }
    return true;
  }
  bool Contains(const Key& key) const { return keys_.count(key) > 0; }
  size_t size() const { return keys_.size(); }

 private:
  size_t capacity_;
  std::set<Key> keys_;
  std::deque<Key> order_;
};

// RecentMap: as RecentSet, with a value per key (the newest Put wins; re-putting a key does not
// refresh its age). Thread-compatible.
template <typename Key, typename Value>
class RecentMap {
 public:
  explicit RecentMap(size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

  void Put(const Key& key, Value value) {
    auto [it, inserted] = values_.insert_or_assign(key, std::move(value));
    if (!inserted) return;
    order_.push_back(key);
    while (order_.size() > capacity_) {
      values_.erase(order_.front());
      order_.pop_front();
    }
  }
  const Value* Find(const Key& key) const {
    auto it = values_.find(key);
    return it == values_.end() ? nullptr : &it->second;
  }
  size_t size() const { return values_.size(); }

 private:
  size_t capacity_;
  std::map<Key, Value> values_;
  std::deque<Key> order_;
};

}  // namespace connex::pp::internal

#endif  // CONNEX_PP_INTERNAL_RECENT_SET_H_
