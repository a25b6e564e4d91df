/* A stand-in for another site's SPANK plugin (pyxis' --container-image, an Apptainer
 * plugin's image option), for the tests of what bftrainerd's satellites carry. It
 * registers --stand-in-image=NAME and records what it was given where such plugins act:
 * the job's prolog (slurmd's job-script context, which reads options from the job's
 * spank_job_env) and each step (slurmstepd's remote context, which reads them from the
 * step's environment or srun's request). Each record is a file
 * OUT/<context>.<jobid>.<stepid> holding "job=J step=S image=NAME" ("image=" when the
 * option was not given). OUT is the plugstack argument out=DIR.
 * Built by the tests with cc against the Slurm release under test. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(standin, 1);

static char image[1024];
static int given;

static int image_cb(int val, const char *optarg, int remote)
{
	(void)val;
	(void)remote;
	if (!optarg || strlen(optarg) >= sizeof(image))
		return -1;
	strcpy(image, optarg);
	given = 1;
	return 0;
}

static struct spank_option image_opt = {
	"stand-in-image", "NAME", "image a stand-in container plugin would run in",
	1, 0, image_cb
};

static const char *out_dir(int ac, char **av)
{
	for (int i = 0; i < ac; i++)
		if (strncmp(av[i], "out=", 4) == 0)
			return av[i] + 4;
	return NULL;
}

static void record(int ac, char **av, const char *context, uint32_t job, uint32_t step,
		   const char *value)
{
	const char *dir = out_dir(ac, av);
	char path[4096], line[2048];
	int fd, n;

	if (!dir)
		return;
	snprintf(path, sizeof(path), "%s/%s.%u.%u", dir, context, job, step);
	n = snprintf(line, sizeof(line), "job=%u step=%u image=%s\n", job, step,
		     value ? value : "");
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0) {
		slurm_error("standin: cannot write %s", path);
		return;
	}
	if (write(fd, line, n) != n)
		slurm_error("standin: short write to %s", path);
	close(fd);
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();
	(void)ac;
	(void)av;
	if (ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR || ctx == S_CTX_REMOTE)
		return spank_option_register(sp, &image_opt) == ESPANK_SUCCESS ? 0 : -1;
	return 0;
}

/* Remote context: the step's options have been processed. */
int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	uint32_t job = 0, step = 0;
	if (!spank_remote(sp))
		return 0;
	spank_get_item(sp, S_JOB_ID, &job);
	spank_get_item(sp, S_JOB_STEPID, &step);
	record(ac, av, "step", job, step, given ? image : NULL);
	return 0;
}

/* Job-script context: slurmd hands the job's spank_job_env to the prolog. */
int slurm_spank_job_prolog(spank_t sp, int ac, char **av)
{
	uint32_t job = 0;
	char *arg = NULL;
	spank_get_item(sp, S_JOB_ID, &job);
	if (spank_option_getopt(sp, &image_opt, &arg) != ESPANK_SUCCESS)
		arg = NULL;
	record(ac, av, "prolog", job, 0, arg);
	return 0;
}
