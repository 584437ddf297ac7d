#include <stdio.h>
#include <fusedattn/fusedattn.h>
int main(void) {
  fusedattn_config cfg = FUSEDATTN_CONFIG_INIT;
  cfg.batch = 1; cfg.heads_q = 2; cfg.heads_kv = 1; cfg.max_seqlen_q = 3; cfg.max_seqlen_kv = 4;
  cfg.head_dim_qk = cfg.head_dim_v = 8; cfg.device = FUSEDATTN_DEVICE_CPU;
  cfg.qkv_dtype = cfg.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  float q[1*3*2*8], k[1*4*1*8], v[1*4*1*8], o[1*3*2*8];
  for (int i = 0; i < 48; ++i) q[i] = (float)((i * 7) % 11) / 11.0f;
  for (int i = 0; i < 32; ++i) { k[i] = (float)((i * 5) % 13) / 13.0f; v[i] = (float)i / 32.0f; }
  fusedattn_fwd_args a = fusedattn_fwd_args_init();
  a.q = (fusedattn_tensor){q, FUSEDATTN_DTYPE_FLOAT32, 4, {1, 3, 2, 8}, {48, 16, 8, 1}};
  a.k = (fusedattn_tensor){k, FUSEDATTN_DTYPE_FLOAT32, 4, {1, 4, 1, 8}, {32, 8, 8, 1}};
  a.v = (fusedattn_tensor){v, FUSEDATTN_DTYPE_FLOAT32, 4, {1, 4, 1, 8}, {32, 8, 8, 1}};
  a.o = (fusedattn_tensor){o, FUSEDATTN_DTYPE_FLOAT32, 4, {1, 3, 2, 8}, {48, 16, 8, 1}};
  char msg[512];
  fusedattn_status st = fusedattn_fwd(&cfg, &a, NULL, 0, NULL, msg, sizeof msg);
  printf("%s %s o[0]=%f version %s\n", fusedattn_status_string(st), msg, o[0], fusedattn_version_string());
  return st;
}
