// Unit tests of the per-rank error file (lockstep/launch/error_file.h): what a failing rank
// writes, what lockstep-run reads back, torchelastic's JSON, and the first-error-wins rule.
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "lockstep/env_contract.h"
#include "lockstep/launch/error_file.h"

using namespace lockstep::launch;

namespace {

class ErrorFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/lockstep-error-file-XXXXXX";
    ASSERT_NE(mkdtemp(templ), nullptr);
    dir_ = templ;
    path_ = error_file_path(dir_, 3);
    unsetenv(lockstep::env::kErrorFile);
    unsetenv(lockstep::env::kTorchelasticErrorFile);
  }
  void TearDown() override {
    unlink(path_.c_str());
    rmdir(dir_.c_str());
    unsetenv(lockstep::env::kErrorFile);
    unsetenv(lockstep::env::kTorchelasticErrorFile);
  }
  void write(const std::string& text) { std::ofstream(path_) << text; }
  std::string dir_, path_;
};

TEST_F(ErrorFileTest, PathNamesTheRank) {
  EXPECT_EQ(error_file_path("/x", 12), "/x/error_rank_12.txt");
}

TEST_F(ErrorFileTest, NoVariableNoFile) {
  EXPECT_FALSE(record_error("boom"));
  EXPECT_EQ(read_error_file(path_), "");
}

TEST_F(ErrorFileTest, FirstErrorWinsAndReadsBack) {
  setenv(lockstep::env::kErrorFile, path_.c_str(), 1);
  EXPECT_TRUE(record_error("rank 0/3 [gloo] allreduce #6: peer gone: rank 2 exited\nline 2"));
  EXPECT_FALSE(record_error("a consequence"));  // the first one stays
  EXPECT_EQ(read_error_file(path_),
            "rank 0/3 [gloo] allreduce #6: peer gone: rank 2 exited\nline 2");
}

TEST_F(ErrorFileTest, TorchelasticVariableIsTheFallback) {
  setenv(lockstep::env::kTorchelasticErrorFile, path_.c_str(), 1);
  EXPECT_TRUE(record_error("from torchelastic's variable"));
  EXPECT_EQ(read_error_file(path_), "from torchelastic's variable");
}

TEST_F(ErrorFileTest, TorchelasticJsonGivesItsMessage) {
  write(
      R"({"message": {"message": "RuntimeError: \"x\" failed\nat step 3", "extraInfo": {"py_callstack": "...", "timestamp": "1700000000"}}})");
  EXPECT_EQ(read_error_file(path_), "RuntimeError: \"x\" failed\nat step 3");
  write(R"({"message": "flat message"})");
  EXPECT_EQ(read_error_file(path_), "flat message");
  write("{not json at all");
  EXPECT_EQ(read_error_file(path_), "{not json at all");  // shown whole rather than lost
}

TEST_F(ErrorFileTest, MissingOrBlankIsEmpty) {
  EXPECT_EQ(read_error_file(dir_ + "/nope"), "");
  write(" \n\n");
  EXPECT_EQ(read_error_file(path_), "");
}

}  // namespace
