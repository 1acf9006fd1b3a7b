/*
 * fake_mlx5.c - stands in for libmlx5.so.1's two calls crux_repath.c uses, for
 * tests/test_repath.py: an mlx5 NIC cannot exist here. Same names, same signatures; it says
 * "supported" for devices named mlx5*, records each re-path, and refuses port 0xBAD0.
 */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <infiniband/verbs.h>

int fake_calls;
uint32_t fake_last_qpn;
uint16_t fake_last_sport;

bool mlx5dv_is_supported(struct ibv_device *device)
{
    return strncmp(device->name, "mlx5", 4) == 0;
}

int mlx5dv_modify_qp_udp_sport(struct ibv_qp *qp, uint16_t udp_sport)
{
    fake_calls++;
    if (udp_sport == 0xBAD0)
        return 95; /* EOPNOTSUPP, as a positive errno like the real call */
    fake_last_qpn = qp->qp_num;
    fake_last_sport = udp_sport;
    return 0;
}
