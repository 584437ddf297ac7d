// The on-disk blob cache (src/common/blob_cache.h) on the CPU: a hit returns what was put, a
// different key (another cuDNN version, another GPU) misses, a file of another key with the
// same name misses, corrupt / truncated / foreign-format files are damaged misses that a put
// repairs, processes writing at once never produce a torn read, eviction keeps the bound and the
// recently used entries, and the environment turns the cache off or moves it.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "common/blob_cache.h"
#include "testing/scoped_env.h"

namespace fusedattn {
namespace {

using fusedattn::testing::ScopedEnv;

std::string MakeTempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base != nullptr && *base ? base : "/tmp") + "/fab_test_XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  const char* made = mkdtemp(buf.data());
  EXPECT_NE(made, nullptr) << std::strerror(errno);
  return made != nullptr ? std::string(made) : std::string();
}

void RemoveTree(const std::string& path) {
  if (path.empty()) return;
  std::string command = "rm -rf '" + path + "'";
  EXPECT_EQ(std::system(command.c_str()), 0);
}

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed * 131 + i * 7 + (i >> 8));
  return v;
}

// A key as the cuDNN backend writes it: library versions, the GPU, the structure.
std::string Key(const char* cudnn, const char* gpu, const char* structure) {
  return std::string("fusedattn-test v1\ncudnn ") + cudnn + "\ngpu " + gpu + "\nstructure " +
         structure;
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

bool Exists(const std::string& path) { return FileSize(path) >= 0; }

void SetMtime(const std::string& path, time_t seconds) {
  struct timespec times[2] = {{seconds, 0}, {seconds, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << std::strerror(errno);
}

class BlobCacheTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir(); }
  void TearDown() override { RemoveTree(dir_); }
  std::string dir_;
};

TEST_F(BlobCacheTest, APutEntryIsAHitWithTheSameBytes) {
  BlobCache cache(dir_ + "/cache", BlobCache::kDefaultMaxBytes);
  ASSERT_TRUE(cache.enabled()) << cache.status().message();
  const std::string key = Key("91900", "H100 sm90 uuid-a", "fwd causal d64");
  const std::vector<uint8_t> payload = Bytes(100000, 3);
  std::vector<uint8_t> out;
  EXPECT_EQ(cache.get(key, &out), BlobCache::Lookup::kMiss);
  ASSERT_TRUE(cache.put(key, payload.data(), payload.size()).ok());
  ASSERT_EQ(cache.get(key, &out), BlobCache::Lookup::kHit);
  EXPECT_EQ(out, payload);
  // An empty payload is a valid entry too.
  const std::string empty_key = key + " empty";
  ASSERT_TRUE(cache.put(empty_key, nullptr, 0).ok());
  EXPECT_EQ(cache.get(empty_key, &out), BlobCache::Lookup::kHit);
  EXPECT_TRUE(out.empty());
  BlobCache::Stats s = cache.stats();
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.writes, 2u);
  // A second object on the directory (another process) reads it.
  BlobCache other(dir_ + "/cache", BlobCache::kDefaultMaxBytes);
  ASSERT_EQ(other.get(key, &out), BlobCache::Lookup::kHit);
  EXPECT_EQ(out, payload);
}

TEST_F(BlobCacheTest, AnotherCudnnVersionOrGpuMisses) {
  BlobCache cache(dir_, BlobCache::kDefaultMaxBytes);
  ASSERT_TRUE(cache.enabled()) << cache.status().message();
  const std::vector<uint8_t> payload = Bytes(4096, 1);
  ASSERT_TRUE(cache.put(Key("91900", "H100 sm90 uuid-a", "s"), payload.data(), payload.size()).ok());
  std::vector<uint8_t> out;
  EXPECT_EQ(cache.get(Key("91400", "H100 sm90 uuid-a", "s"), &out), BlobCache::Lookup::kMiss);
  EXPECT_EQ(cache.get(Key("91900", "H100 sm90 uuid-b", "s"), &out), BlobCache::Lookup::kMiss);
  EXPECT_EQ(cache.get(Key("91900", "H200 sm90 uuid-a", "s"), &out), BlobCache::Lookup::kMiss);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(cache.get(Key("91900", "H100 sm90 uuid-a", "s"), &out), BlobCache::Lookup::kHit);
  EXPECT_EQ(cache.stats().damaged, 0u);
}

TEST_F(BlobCacheTest, AFileOfAnotherKeyUnderTheSameNameMisses) {
  // Two keys whose names collide (simulated by moving one's file to the other's name): the
  // stored key is compared, so the intact file of the other key is a plain miss.
  BlobCache cache(dir_, BlobCache::kDefaultMaxBytes);
  const std::string a = Key("91900", "gpu", "a"), b = Key("91900", "gpu", "b");
  const std::vector<uint8_t> payload = Bytes(1000, 2);
  ASSERT_TRUE(cache.put(a, payload.data(), payload.size()).ok());
  ASSERT_NE(cache.path_of(a), cache.path_of(b));
  ASSERT_EQ(rename(cache.path_of(a).c_str(), cache.path_of(b).c_str()), 0);
  std::vector<uint8_t> out;
  EXPECT_EQ(cache.get(b, &out), BlobCache::Lookup::kMiss);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(cache.stats().damaged, 0u);
}

TEST_F(BlobCacheTest, ACorruptFileIsIgnoredAndRewritten) {
  BlobCache cache(dir_, BlobCache::kDefaultMaxBytes);
  const std::string key = Key("91900", "gpu", "corrupt");
  const std::vector<uint8_t> payload = Bytes(50000, 4);
  ASSERT_TRUE(cache.put(key, payload.data(), payload.size()).ok());
  const std::string path = cache.path_of(key);
  // One flipped bit in the payload, in the key, and in the header's lengths.
  for (int64_t offset : {FileSize(path) - 100, int64_t{BlobCache::kHeaderBytes + 3}, int64_t{16}}) {
    SCOPED_TRACE(offset);
    ASSERT_TRUE(cache.put(key, payload.data(), payload.size()).ok());
    {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(offset);
      char c = 0;
      f.read(&c, 1);
      c = static_cast<char>(c ^ 0x10);
      f.seekp(offset);
      f.write(&c, 1);
    }
    std::vector<uint8_t> out;
    const uint64_t damaged = cache.stats().damaged;
    EXPECT_EQ(cache.get(key, &out), BlobCache::Lookup::kDamaged);
    EXPECT_TRUE(out.empty());
    EXPECT_EQ(cache.stats().damaged, damaged + 1);
    ASSERT_TRUE(cache.put(key, payload.data(), payload.size()).ok());  // the rebuild's write
    ASSERT_EQ(cache.get(key, &out), BlobCache::Lookup::kHit);
    EXPECT_EQ(out, payload);
  }
}

TEST_F(BlobCacheTest, ATruncatedFileIsIgnoredAndRewritten) {
  BlobCache cache(dir_, BlobCache::kDefaultMaxBytes);
  const std::string key = Key("91900", "gpu", "truncated");
  const std::vector<uint8_t> payload = Bytes(30000, 5);
  for (int64_t keep : {int64_t{0}, int64_t{10}, int64_t{BlobCache::kHeaderBytes}, int64_t{20000}}) {
    SCOPED_TRACE(keep);
    ASSERT_TRUE(cache.put(key, payload.data(), payload.size()).ok());
    ASSERT_EQ(truncate(cache.path_of(key).c_str(), keep), 0);
    std::vector<uint8_t> out;
    EXPECT_EQ(cache.get(key, &out), BlobCache::Lookup::kDamaged);
    EXPECT_TRUE(out.empty());
    ASSERT_TRUE(cache.put(key, payload.data(), payload.size()).ok());
    ASSERT_EQ(cache.get(key, &out), BlobCache::Lookup::kHit);
    EXPECT_EQ(out, payload);
  }
  // Bytes appended after a complete entry are damage too.
  {
    std::ofstream f(cache.path_of(key), std::ios::app | std::ios::binary);
    f << "tail";
  }
  std::vector<uint8_t> out;
  EXPECT_EQ(cache.get(key, &out), BlobCache::Lookup::kDamaged);
}

TEST_F(BlobCacheTest, AFileOfAnotherFormatIsDamaged) {
  BlobCache cache(dir_, BlobCache::kDefaultMaxBytes);
  const std::string key = Key("91900", "gpu", "format");
  const std::vector<uint8_t> payload = Bytes(100, 6);
  ASSERT_TRUE(cache.put(key, payload.data(), payload.size()).ok());
  // Version field (bytes 8..11) of a newer format: damaged (its header check fails too).
  {
    std::fstream f(cache.path_of(key), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    const uint32_t version = BlobCache::kFormatVersion + 1;
    f.write(reinterpret_cast<const char*>(&version), sizeof version);
  }
  std::vector<uint8_t> out;
  EXPECT_EQ(cache.get(key, &out), BlobCache::Lookup::kDamaged);
  // A file that is not an entry at all.
  {
    std::ofstream f(cache.path_of(key), std::ios::trunc | std::ios::binary);
    f << "this is not a fusedattn cache entry, just some text of a plausible length......";
  }
  EXPECT_EQ(cache.get(key, &out), BlobCache::Lookup::kDamaged);
}

// Processes that write the same key and their own keys while reading: every read is a miss or
// a complete, self-consistent payload of one writer, never a damaged (torn) file.
TEST_F(BlobCacheTest, ProcessesWritingAtOnceNeverProduceATornRead) {
  const std::string shared = Key("91900", "gpu", "shared");
  constexpr int kProcesses = 4;
  constexpr int kRounds = 40;
  // Payload of writer w in round r: its length and every byte follow from (w, r), so a reader
  // can tell a complete payload from a mix of two.
  auto payload_of = [](int w, int r) {
    std::vector<uint8_t> v(size_t{65536} + static_cast<size_t>(w * 4099 + r * 13));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(w * 31 + r * 7 + i % 251);
    return v;
  };
  auto consistent = [&](const std::vector<uint8_t>& v) {
    for (int w = 0; w < kProcesses; ++w)
      for (int r = 0; r < kRounds; ++r)
        if (v.size() == payload_of(w, r).size() && v == payload_of(w, r)) return true;
    return false;
  };
  std::vector<pid_t> children;
  for (int w = 0; w < kProcesses; ++w) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0) << std::strerror(errno);
    if (pid == 0) {
      int failures = 0;
      BlobCache cache(dir_, BlobCache::kDefaultMaxBytes);
      const std::string own = Key("91900", "gpu", ("own " + std::to_string(w)).c_str());
      for (int r = 0; r < kRounds; ++r) {
        const std::vector<uint8_t> p = payload_of(w, r);
        if (!cache.put(shared, p.data(), p.size()).ok()) ++failures;
        if (!cache.put(own, p.data(), p.size()).ok()) ++failures;
        std::vector<uint8_t> out;
        BlobCache::Lookup l = cache.get(shared, &out);
        if (l == BlobCache::Lookup::kDamaged || (l == BlobCache::Lookup::kHit && !consistent(out)))
          ++failures;
        l = cache.get(own, &out);  // only this process writes it: exactly what it wrote
        if (l != BlobCache::Lookup::kHit || out != p) ++failures;
      }
      _exit(failures == 0 ? 0 : 1);
    }
    children.push_back(pid);
  }
  // The parent reads meanwhile.
  BlobCache reader(dir_, BlobCache::kDefaultMaxBytes);
  int hits = 0;
  for (int i = 0; i < 200; ++i) {
    std::vector<uint8_t> out;
    BlobCache::Lookup l = reader.get(shared, &out);
    ASSERT_NE(l, BlobCache::Lookup::kDamaged) << "a torn or partial file was visible";
    if (l == BlobCache::Lookup::kHit) {
      ++hits;
      ASSERT_TRUE(consistent(out)) << "a payload mixed from two writers";
    }
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "writer " << pid << " saw a torn read";
  }
  std::vector<uint8_t> out;
  ASSERT_EQ(reader.get(shared, &out), BlobCache::Lookup::kHit);
  EXPECT_TRUE(consistent(out));
  // No temporary file is left behind.
  std::string listing = dir_ + "/.tmp.";
  std::string command = "ls -a '" + dir_ + "' | grep -q '^\\.tmp\\.'";
  EXPECT_NE(std::system(command.c_str()), 0) << "temporary files left in " << dir_;
}

TEST_F(BlobCacheTest, EvictionKeepsTheBoundAndTheRecentlyUsedEntries) {
  const size_t entry = 16 * 1024;
  BlobCache cache(dir_, 8 * entry);  // about 7 entries with their headers and keys
  std::vector<std::string> keys;
  const time_t t0 = std::time(nullptr) - 10000;
  for (int i = 0; i < 7; ++i) {
    keys.push_back(Key("91900", "gpu", ("entry " + std::to_string(i)).c_str()));
    const std::vector<uint8_t> p = Bytes(entry, static_cast<uint8_t>(i));
    ASSERT_TRUE(cache.put(keys.back(), p.data(), p.size()).ok());
    SetMtime(cache.path_of(keys.back()), t0 + i);  // a strict age order
  }
  EXPECT_EQ(cache.stats().evictions, 0u);
  std::vector<uint8_t> out;
  ASSERT_EQ(cache.get(keys[0], &out), BlobCache::Lookup::kHit);  // now the most recent
  // Two more entries push the total over the bound: the oldest unused ones go, down to 3/4.
  for (int i = 7; i < 9; ++i) {
    keys.push_back(Key("91900", "gpu", ("entry " + std::to_string(i)).c_str()));
    const std::vector<uint8_t> p = Bytes(entry, static_cast<uint8_t>(i));
    ASSERT_TRUE(cache.put(keys.back(), p.data(), p.size()).ok());
  }
  EXPECT_GT(cache.stats().evictions, 0u);
  int64_t total = 0;
  for (const std::string& k : keys)
    if (Exists(cache.path_of(k))) total += FileSize(cache.path_of(k));
  EXPECT_LE(total, int64_t{8 * entry});
  EXPECT_TRUE(Exists(cache.path_of(keys[0]))) << "the entry read last survives";
  EXPECT_TRUE(Exists(cache.path_of(keys[8]))) << "the entry written last survives";
  EXPECT_FALSE(Exists(cache.path_of(keys[1]))) << "the least recently used entry goes first";
  // An entry larger than the whole bound is refused, naming the bound.
  const std::vector<uint8_t> huge = Bytes(9 * entry, 9);
  Status s = cache.put(Key("91900", "gpu", "huge"), huge.data(), huge.size());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("FUSEDATTN_CACHE_MAX_MB"), std::string::npos) << s.message();
}

TEST_F(BlobCacheTest, StaleTemporaryFilesAreRemoved) {
  BlobCache cache(dir_, BlobCache::kDefaultMaxBytes);
  const std::string stale = dir_ + "/.tmp.deadbeef.fab.1.0", fresh = dir_ + "/.tmp.cafe.fab.2.0";
  std::ofstream(stale) << "left by a crashed writer";
  std::ofstream(fresh) << "being written right now";
  SetMtime(stale, std::time(nullptr) - 2 * 3600);
  const std::vector<uint8_t> p = Bytes(10, 1);
  ASSERT_TRUE(cache.put(Key("91900", "gpu", "x"), p.data(), p.size()).ok());
  EXPECT_FALSE(Exists(stale));
  EXPECT_TRUE(Exists(fresh));
}

TEST_F(BlobCacheTest, ADirectoryOthersCanWriteIsRefused) {
  const std::string shared = dir_ + "/shared";
  ASSERT_EQ(mkdir(shared.c_str(), 0777), 0);
  ASSERT_EQ(chmod(shared.c_str(), 0777), 0);  // mkdir's mode passes through the umask
  BlobCache cache(shared, BlobCache::kDefaultMaxBytes);
  EXPECT_FALSE(cache.enabled());
  EXPECT_NE(cache.status().message().find("writable by group or others"), std::string::npos)
      << cache.status().message();
  const std::vector<uint8_t> p = Bytes(10, 1);
  EXPECT_FALSE(cache.put(Key("91900", "gpu", "x"), p.data(), p.size()).ok());
  std::vector<uint8_t> out;
  EXPECT_EQ(cache.get(Key("91900", "gpu", "x"), &out), BlobCache::Lookup::kMiss);
  // A file where the directory should be.
  const std::string file = dir_ + "/a_file";
  std::ofstream(file) << "x";
  EXPECT_FALSE(BlobCache(file, BlobCache::kDefaultMaxBytes).enabled());
  // Missing parents are created, private.
  BlobCache nested(dir_ + "/a/b/c", BlobCache::kDefaultMaxBytes);
  ASSERT_TRUE(nested.enabled()) << nested.status().message();
  struct stat st;
  ASSERT_EQ(stat((dir_ + "/a/b/c").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 077, 0u);
}

TEST(CacheLocation, TheEnvironmentTurnsTheCacheOffOrMovesIt) {
  ScopedEnv env;
  env.set("FUSEDATTN_CACHE_MAX_MB", nullptr);
  for (const char* off : {"", "0", "off", "OFF", "false", "no"}) {
    env.set("FUSEDATTN_CACHE_DIR", off);
    CacheLocation loc = CacheLocationFromEnvironment();
    EXPECT_FALSE(loc.enabled) << "'" << off << "'";
    EXPECT_NE(loc.reason.find("FUSEDATTN_CACHE_DIR"), std::string::npos) << loc.reason;
  }
  env.set("FUSEDATTN_CACHE_DIR", "/somewhere/else");
  CacheLocation loc = CacheLocationFromEnvironment();
  EXPECT_TRUE(loc.enabled);
  EXPECT_EQ(loc.directory, "/somewhere/else");
  EXPECT_EQ(loc.max_bytes, BlobCache::kDefaultMaxBytes);

  env.set("FUSEDATTN_CACHE_DIR", nullptr);
  env.set("XDG_CACHE_HOME", "/xdg/cache");
  loc = CacheLocationFromEnvironment();
  EXPECT_TRUE(loc.enabled);
  EXPECT_EQ(loc.directory, "/xdg/cache/fusedattn");
  env.set("XDG_CACHE_HOME", nullptr);
  env.set("HOME", "/home/someone");
  loc = CacheLocationFromEnvironment();
  EXPECT_EQ(loc.directory, "/home/someone/.cache/fusedattn");
  env.set("HOME", nullptr);
  loc = CacheLocationFromEnvironment();
  EXPECT_FALSE(loc.enabled);
  EXPECT_NE(loc.reason.find("HOME"), std::string::npos) << loc.reason;

  env.set("FUSEDATTN_CACHE_DIR", "/x");
  env.set("FUSEDATTN_CACHE_MAX_MB", "64");
  EXPECT_EQ(CacheLocationFromEnvironment().max_bytes, uint64_t{64} << 20);
  env.set("FUSEDATTN_CACHE_MAX_MB", "lots");
  loc = CacheLocationFromEnvironment();
  EXPECT_FALSE(loc.enabled);
  EXPECT_NE(loc.reason.find("FUSEDATTN_CACHE_MAX_MB = 'lots'"), std::string::npos) << loc.reason;
}

TEST(CacheLocation, ADisabledCacheMissesAndWritesNothing) {
  BlobCache cache = BlobCache::Disabled("FUSEDATTN_CACHE_DIR = 'off' turns the on-disk cache off");
  EXPECT_FALSE(cache.enabled());
  std::vector<uint8_t> out;
  EXPECT_EQ(cache.get("k", &out), BlobCache::Lookup::kMiss);
  Status s = cache.put("k", "v", 1);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("FUSEDATTN_CACHE_DIR"), std::string::npos);
  EXPECT_EQ(cache.stats().writes, 0u);
}

TEST(BlobHash, SeedsAndBytesChangeTheHash) {
  const char a[] = "0123456789abcdefXYZ";
  EXPECT_EQ(HashBytes(a, sizeof a, 1), HashBytes(a, sizeof a, 1));
  EXPECT_NE(HashBytes(a, sizeof a, 1), HashBytes(a, sizeof a, 2));
  EXPECT_NE(HashBytes(a, sizeof a - 1, 1), HashBytes(a, sizeof a, 1));
  char b[sizeof a];
  std::memcpy(b, a, sizeof a);
  for (size_t i = 0; i < sizeof a; ++i) {  // every byte position counts, tail included
    b[i] ^= 1;
    EXPECT_NE(HashBytes(a, sizeof a, 1), HashBytes(b, sizeof b, 1)) << i;
    b[i] ^= 1;
  }
}

}  // namespace
}  // namespace fusedattn
