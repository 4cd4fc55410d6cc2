#include "memory/kv_layout.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(KvLayoutTest, MhaIsAKAndAVBufferPerLayer) {
  ASSERT_OK_AND_ASSIGN(
      KvLayout layout,
      ParseKvLayout("mha:layers=32,kv_heads=8,head_dim=128,dtype=bf16"));
  ASSERT_EQ(layout.buffers.size(), 64u);
  EXPECT_EQ(layout.buffers[0].name, "k.0");
  EXPECT_EQ(layout.buffers[1].name, "v.0");
  EXPECT_EQ(layout.buffers[63].name, "v.31");
  EXPECT_THAT(layout.buffers[0].element_shape, ElementsAre(8, 128));
  EXPECT_EQ(layout.buffers[0].dtype, KvDtype::kBf16);
  EXPECT_EQ(layout.buffers[0].element_bytes(), 8 * 128 * 2);
  EXPECT_EQ(layout.slot_bytes(), 64 * 8 * 128 * 2);
  EXPECT_EQ(layout.text, "mha:layers=32,kv_heads=8,head_dim=128,dtype=bf16");
}

TEST(KvLayoutTest, MhaTakesAVHeadDimAndAnyKeyOrder) {
  ASSERT_OK_AND_ASSIGN(KvLayout layout,
                       ParseKvLayout("mha:dtype=fp8_e4m3,head_dim=192,v_head_"
                                     "dim=128,kv_heads=2,layers=1"));
  ASSERT_EQ(layout.buffers.size(), 2u);
  EXPECT_THAT(layout.buffers[0].element_shape, ElementsAre(2, 192));
  EXPECT_THAT(layout.buffers[1].element_shape, ElementsAre(2, 128));
  EXPECT_EQ(layout.slot_bytes(), 2 * 192 + 2 * 128);
  EXPECT_EQ(layout.text,
            "mha:layers=1,kv_heads=2,head_dim=192,dtype=fp8_e4m3,v_head_dim="
            "128");
  // The canonical text parses to the same layout.
  ASSERT_OK_AND_ASSIGN(KvLayout again, ParseKvLayout(layout.text));
  EXPECT_EQ(again.text, layout.text);
}

TEST(KvLayoutTest, MlaIsOneBufferPerLayer) {
  ASSERT_OK_AND_ASSIGN(
      KvLayout layout,
      ParseKvLayout("mla:layers=61,kv_lora_rank=512,rope_dim=64,dtype=bf16"));
  ASSERT_EQ(layout.buffers.size(), 61u);
  EXPECT_EQ(layout.buffers[60].name, "kv.60");
  EXPECT_THAT(layout.buffers[0].element_shape, ElementsAre(1, 576));
  EXPECT_EQ(layout.slot_bytes(), 61 * 576 * 2);
}

TEST(KvLayoutTest, CustomBuffersWithAndWithoutLayers) {
  ASSERT_OK_AND_ASSIGN(
      KvLayout per_layer,
      ParseKvLayout("custom:layers=2,k=fp8_e4m3:8x128,k_scale=fp32:8"));
  ASSERT_EQ(per_layer.buffers.size(), 4u);
  EXPECT_EQ(per_layer.buffers[0].name, "k.0");
  EXPECT_EQ(per_layer.buffers[1].name, "k_scale.0");
  EXPECT_EQ(per_layer.buffers[3].name, "k_scale.1");
  EXPECT_EQ(per_layer.buffers[1].dtype, KvDtype::kFp32);
  EXPECT_THAT(per_layer.buffers[1].element_shape, ElementsAre(8));
  EXPECT_EQ(per_layer.slot_bytes(), 2 * (8 * 128 + 32));

  ASSERT_OK_AND_ASSIGN(KvLayout flat,
                       ParseKvLayout("custom:a=uint8:3,b=int32:2x2"));
  ASSERT_EQ(flat.buffers.size(), 2u);
  EXPECT_EQ(flat.buffers[0].name, "a");
  EXPECT_EQ(flat.slot_bytes(), 3 + 16);
  EXPECT_EQ(flat.text, "custom:a=uint8:3,b=int32:2x2");
}

TEST(KvLayoutTest, EveryDtypeHasASize) {
  for (const char* name : {"bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2",
                           "int8", "uint8", "int32"}) {
    ASSERT_OK_AND_ASSIGN(KvDtype dtype, ParseKvDtype(name));
    EXPECT_EQ(KvDtypeName(dtype), name);
    EXPECT_GT(KvDtypeBytes(dtype), 0);
  }
}

TEST(KvLayoutTest, BadLayoutsNameWhatIsWrong) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"mha", "expected mha:..., mla:... or custom:..."},
      {"gqa:layers=1", "kind \"gqa\" is not mha, mla or custom"},
      {"mha:layers=32,kv_heads=8,head_dim=128", "mha needs dtype"},
      {"mha:layers=32,kv_heads=8,head_dim=128,dtype=bf15",
       "dtype \"bf15\" is not one of bf16"},
      {"mha:layers=0,kv_heads=8,head_dim=128,dtype=bf16",
       "layers=0 is not an integer in 1..2048"},
      {"mha:layers=2,kv_heads=8,head_dim=128,dtype=bf16,rope_dim=4",
       "unknown key rope_dim for mha"},
      {"mla:layers=2,kv_lora_rank=512,rope_dim=64,dtype=bf16,dtype=fp16",
       "dtype given twice"},
      {"custom:", "\"\" is not key=value"},
      {"custom:K=bf16:4", "buffer name \"K\""},
      {"custom:k=bf16", "k=bf16 is not DTYPE:D0xD1x..."},
      {"custom:k=bf16:4x0", "k=0 is not an integer"},
      {"custom:k=bf16:4,layers=2", "layers= must come first"},
      {"custom:layers=2", "custom: names no buffer"},
      {"custom:k=fp32:65536x65536", "buffer k's element is too large"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(
        ParseKvLayout(c.text),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.text;
  }
}

TEST(KvSlabTest, BuffersLieOneAfterAnotherAligned) {
  ASSERT_OK_AND_ASSIGN(KvLayout layout,
                       ParseKvLayout("custom:a=uint8:3,b=fp32:5"));
  ASSERT_OK_AND_ASSIGN(KvSlabGeometry slab,
                       PlaceKvSlab(layout, /*page_size=*/4, /*num_pages=*/9,
                                   /*alignment=*/64));
  EXPECT_EQ(slab.num_slots, 40);
  EXPECT_EQ(slab.bytes_per_page, 4 * 23);
  ASSERT_EQ(slab.placements.size(), 2u);
  EXPECT_EQ(slab.placements[0].offset, 0);
  EXPECT_EQ(slab.placements[0].stride_bytes, 3);
  EXPECT_EQ(slab.placements[0].bytes, 120);
  EXPECT_EQ(slab.placements[1].offset, 128);
  EXPECT_EQ(slab.placements[1].stride_bytes, 20);
  EXPECT_EQ(slab.placements[1].bytes, 800);
  EXPECT_EQ(slab.total_bytes, 128 + 832);
}

TEST(KvSlabTest, FitTakesTheMostPagesTheBudgetHolds) {
  ASSERT_OK_AND_ASSIGN(
      KvLayout layout,
      ParseKvLayout("mha:layers=32,kv_heads=8,head_dim=128,dtype=bf16"));
  const int64_t granularity = int64_t{2} << 20;
  for (int64_t budget :
       {int64_t{80} << 30, int64_t{1} << 30, int64_t{300} << 20}) {
    for (int64_t page_size : {1, 16, 64}) {
      ASSERT_OK_AND_ASSIGN(KvSlabGeometry slab,
                           FitKvSlab(layout, page_size, budget, granularity));
      EXPECT_LE(slab.total_bytes, budget);
      EXPECT_EQ(slab.total_bytes % granularity, 0);
      ASSERT_OK_AND_ASSIGN(
          KvSlabGeometry more,
          PlaceKvSlab(layout, page_size, slab.num_pages + 1, granularity));
      EXPECT_GT(more.total_bytes, budget)
          << budget << " bytes, page_size " << page_size;
      for (size_t b = 0; b < slab.placements.size(); ++b) {
        EXPECT_EQ(slab.placements[b].offset % granularity, 0);
        if (b > 0) {
          EXPECT_GE(
              slab.placements[b].offset,
              slab.placements[b - 1].offset + slab.placements[b - 1].bytes);
        }
      }
    }
  }
}

TEST(KvSlabTest, ABudgetThatLeavesNoPageIsRefusedWithTheNumbers) {
  ASSERT_OK_AND_ASSIGN(
      KvLayout layout,
      ParseKvLayout("mha:layers=32,kv_heads=8,head_dim=128,dtype=bf16"));
  // 64 buffers aligned to 2 MiB need 128 MiB before any slot.
  EXPECT_THAT(FitKvSlab(layout, 16, int64_t{100} << 20, int64_t{2} << 20),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a KV budget of 100.0 MiB (104857600 bytes) "
                                 "leaves no usable page: page 0 and one page "
                                 "of 16 slots need 128.0 MiB (64 buffers, "
                                 "131072 bytes a slot")));
  EXPECT_THAT(FitKvSlab(layout, 16, 1000, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not a power of two")));
}

TEST(KvMemoryTest, SizesAndFractions) {
  ASSERT_OK_AND_ASSIGN(KvMemoryBudget gib, ParseKvMemory("80GiB"));
  EXPECT_EQ(gib.bytes, int64_t{80} << 30);
  EXPECT_EQ(gib.Resolve(1), int64_t{80} << 30);
  ASSERT_OK_AND_ASSIGN(KvMemoryBudget mb, ParseKvMemory("1.5MB"));
  EXPECT_EQ(mb.bytes, 1500000);
  ASSERT_OK_AND_ASSIGN(KvMemoryBudget plain, ParseKvMemory("4096"));
  EXPECT_EQ(plain.bytes, 4096);
  ASSERT_OK_AND_ASSIGN(KvMemoryBudget share, ParseKvMemory("0.9"));
  EXPECT_EQ(share.bytes, 0);
  EXPECT_DOUBLE_EQ(share.fraction, 0.9);
  EXPECT_EQ(share.Resolve(1000), 900);
  for (const char* bad :
       {"", "0", "-1GiB", "1.5", "0.0", "GiB", "12 parsecs", "nan"}) {
    EXPECT_THAT(ParseKvMemory(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("is neither a size")))
        << bad;
  }
}

TEST(KvMemoryTest, FormatBytes) {
  EXPECT_EQ(FormatBytes(12), "12 B");
  EXPECT_EQ(FormatBytes(4096), "4.0 KiB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 29), "1.5 GiB");
}

}  // namespace
}  // namespace pagealloc
