/* The floor for the submission benchmark: the least a SPANK plugin can be. It registers
 * one option, as spank_bftrainer does, and nothing else; sbatch's cost of loading it is
 * what any SPANK plugin costs, whatever its language. Compiled by the bench with cc. */
#include <slurm/spank.h>

SPANK_PLUGIN(floor, 1);

static int floor_cb(int val, const char *optarg, int remote)
{
	(void)val;
	(void)optarg;
	(void)remote;
	return 0;
}

static struct spank_option floor_opt = {
	"elastic", "MIN[:MAX][,key=value...]", "floor plugin of the submission benchmark",
	1, 0, floor_cb
};

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();
	(void)ac;
	(void)av;
	if (ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR || ctx == S_CTX_REMOTE)
		return spank_option_register(sp, &floor_opt) == ESPANK_SUCCESS ? 0 : -1;
	return 0;
}
