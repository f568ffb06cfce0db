// The plain progress line the kvq program prints on a stderr that is not a terminal (tools/kvq/progress.cpp).
#include <gtest/gtest.h>

#include "../tools/kvq/progress.hpp"

namespace kvq::cli {
namespace {

TEST(ProgressLine, NamesTheWorkDoneTheTimeSpentAndTheTimeLeft) {
  EXPECT_EQ(progress_line("ppl", 12, 32, 302), "kvq ppl: 12/32 (37.5%), 5 min 02 s elapsed, about 8 min 23 s left");
  EXPECT_EQ(progress_line("decode speed", 1, 3, 40),
            "kvq decode speed: 1/3 (33.3%), 40 s elapsed, about 1 min 20 s left");
}

TEST(ProgressLine, HasNoEstimateBeforeAnyWorkIsDone) {
  EXPECT_EQ(progress_line("ppl", 0, 8, 31), "kvq ppl: 0/8 (0.0%), 31 s elapsed, time left unknown");
}

TEST(ProgressLine, IsOneLineWithoutCarriageReturns) {
  const std::string line = progress_line("bench attention", 7, 9, 4000);
  EXPECT_EQ(line.find_first_of("\r\n\033"), std::string::npos) << line;
}

TEST(DurationText, RoundsToWhatAPersonReads) {
  EXPECT_EQ(duration_text(0), "0 s");
  EXPECT_EQ(duration_text(59.4), "59 s");
  EXPECT_EQ(duration_text(59.6), "1 min 00 s");
  EXPECT_EQ(duration_text(3599), "59 min 59 s");
  EXPECT_EQ(duration_text(2 * 3600 + 7 * 60 + 30), "2 h 07 min");
  EXPECT_EQ(duration_text(-3), "0 s");
}

}  // namespace
}  // namespace kvq::cli
